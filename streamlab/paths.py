"""Where streamlab finds what it needs: one answer for every entry point (the
`streamlab` CLI, the pytest plugin, `streamlab check`), run from a clone or
from an installed wheel.

    the lab's files       lab.env, the edge proxies' config templates, the
                          Toxiproxy patch: `data_file(path)`, the wheel's copy
                          (streamlab/_data/PATH, which setup.py copies there at
                          build time) or else the clone's own file (PATH under
                          the repo root)
    the run dir           a lab's pids, logs and rendered configs: `run_dir()`,
                          $STREAMLAB_STATE_DIR, else a clone's .run, else the
                          user's state directory ($XDG_STATE_HOME/streamlab,
                          ~/.local/state/streamlab); `--run-dir` overrides it
    the Toxiproxy binary  `find_toxiproxy()`: $STREAMLAB_TOXIPROXY_DIR, a clone's
                          .tools/bin (scripts/build_toxiproxy.sh), the user's
                          cache (`streamlab install toxiproxy`: $XDG_CACHE_HOME/
                          streamlab/bin, ~/.cache/streamlab/bin), then PATH

Standard library only: streamlab.lab imports it, and it imports no part of
streamlab but the exception root.
"""

from __future__ import annotations

import os
import shutil
from importlib.resources import files
from pathlib import Path

from streamlab.errors import StreamlabError

# The checkout this module sits in, when it sits in one (a clone, an editable
# install); in an installed wheel, site-packages, which holds no lab.env.
REPO_ROOT = Path(__file__).resolve().parents[1]
# Where the wheel carries the lab's files (setup.py's LAB_DATA, same paths).
PACKAGED = "_data"

RUN_DIR_VAR = "STREAMLAB_STATE_DIR"
TOXIPROXY_DIR_VAR = "STREAMLAB_TOXIPROXY_DIR"
TOXIPROXY_BINARIES = ("toxiproxy-server", "toxiproxy-cli")


class ToxiproxyNotFound(StreamlabError, FileNotFoundError):
    """No toxiproxy-server (or -cli) where streamlab looks for one; the message
    names every place looked and how to get one."""


# What the compose lab needs that a wheel does not carry.
COMPOSE_NEEDS_A_CLONE = (
    "the compose lab is built from a clone of streamlab's repository (compose.yaml, the "
    "Dockerfiles, the proxies' configs), and this streamlab is installed without one: "
    "clone the repository and run it from there")


def clone() -> Path | None:
    """The repo root when streamlab runs from a clone of its repository, else None."""
    if (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "lab.env").is_file():
        return REPO_ROOT
    return None


def data_file(relative: str) -> Path:
    """One of the lab's files by its path in the repository ("lab.env",
    "proxies/nginx/nginx.conf.template"): the wheel's copy, else the clone's.
    A path that is in neither is returned as the clone's (its reader says it is
    missing)."""
    packaged = files("streamlab").joinpath(PACKAGED, relative)
    if isinstance(packaged, Path) and packaged.is_file():
        return packaged
    return REPO_ROOT / relative


def lab_env() -> Path:
    return data_file("lab.env")


def proxy_template(proxy: str, config_name: str) -> Path:
    """An edge proxy's config template (proxies/PROXY/CONFIG.template)."""
    return data_file(f"proxies/{proxy}/{config_name}.template")


def toxiproxy_patch_dir() -> Path:
    """The lab's Toxiproxy patch and its regression test (scripts/build_toxiproxy.sh)."""
    return data_file("proxies/toxiproxy/patches/interruptible-sends.patch").parent


# ---- the user's directories ----------------------------------------------------------

def _xdg(variable: str, fallback: str) -> Path:
    given = os.environ.get(variable, "")
    base = Path(given) if given and Path(given).is_absolute() else Path.home() / fallback
    return base / "streamlab"


def state_home() -> Path:
    """$XDG_STATE_HOME/streamlab (~/.local/state/streamlab)."""
    return _xdg("XDG_STATE_HOME", ".local/state")


def cache_home() -> Path:
    """$XDG_CACHE_HOME/streamlab (~/.cache/streamlab)."""
    return _xdg("XDG_CACHE_HOME", ".cache")


def run_dir() -> Path:
    """The default run dir of every entry point (module docstring)."""
    given = os.environ.get(RUN_DIR_VAR, "")
    if given:
        return Path(given).expanduser().absolute()
    root = clone()
    return root / ".run" if root is not None else state_home()


# ---- Toxiproxy -----------------------------------------------------------------------

def toxiproxy_install_dir() -> Path:
    """Where `streamlab install toxiproxy` puts the binaries."""
    return cache_home() / "bin"


def toxiproxy_places() -> list[tuple[str, Path]]:
    """(what, directory) in the order they are searched (before PATH)."""
    given = os.environ.get(TOXIPROXY_DIR_VAR, "")
    if given:  # an explicit choice: nothing else is looked at, PATH included
        return [(f"${TOXIPROXY_DIR_VAR}", Path(given).expanduser())]
    places = []
    root = clone()
    if root is not None:
        places.append(("the clone's .tools/bin", root / ".tools" / "bin"))
    places.append(("the user cache", toxiproxy_install_dir()))
    return places


def find_toxiproxy(binary: str = "toxiproxy-server") -> str:
    """The Toxiproxy binary (toxiproxy-server or toxiproxy-cli) the lab runs."""
    places = toxiproxy_places()
    for _, directory in places:
        candidate = directory / binary
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    explicit = bool(os.environ.get(TOXIPROXY_DIR_VAR))
    found = None if explicit else shutil.which(binary)
    if found is not None:
        return found
    looked = ", ".join(f"{what} ({directory})" for what, directory in places)
    how = ("`make up` or scripts/build_toxiproxy.sh builds the lab's patched one into "
           ".tools/bin; " if clone() is not None else "")
    raise ToxiproxyNotFound(
        f"{binary} is not installed (looked in {looked}{'' if explicit else ', PATH'}). "
        f"{how}`streamlab install toxiproxy` builds it into {toxiproxy_install_dir()} "
        f"(needs Go >= 1.23); ${TOXIPROXY_DIR_VAR} names a directory that holds one")
