"""`streamlab install toxiproxy`: the lab's patched Toxiproxy for an installed
streamlab, built the way scripts/build_toxiproxy.sh builds it in a clone.

    the pinned module's source (`go mod download`, Go's module proxy)
      + the lab's patch (proxies/toxiproxy/patches/, carried by the wheel)
      → static toxiproxy-server and toxiproxy-cli in the user's cache
        (streamlab/paths.py: toxiproxy_install_dir), where the lab, the pytest
        plugin and `streamlab check` look for them

Why a patched build and not upstream's binary: scripts/build_toxiproxy.sh says
(a control API that wedges on a blocked reader). The same key as the script's
(version + the patch's and its test's hash) names the build: a stamp file
beside the binaries, so a second install is a no-op until the patch changes.

Go 1.23 or later builds it (Toxiproxy v2.12.0's go.mod). A Go from 1.21 on can
fetch that toolchain itself when GOTOOLCHAIN allows it (`auto`, or a version:
GOTOOLCHAIN=go1.23.0); an older Go (Debian 12's golang is 1.19) cannot, and
the install stops with ToolMissing saying so.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from streamlab import paths
from streamlab.errors import StreamlabError

TOXIPROXY_VERSION = "v2.12.0"  # scripts/build_toxiproxy.sh's default too
MODULE = "github.com/Shopify/toxiproxy/v2"
PATCH = "interruptible-sends.patch"
PATCH_TEST = "blocked_writer_test.go"
GO_NEEDED = (1, 23)  # Toxiproxy v2.12.0's go.mod: go 1.23.0
GO_SWITCHES = (1, 21)  # from Go 1.21 on, `go` fetches the toolchain a go.mod asks for
GO_TOOLCHAIN = "go1.23.0"
GO_DOWNLOAD = "https://go.dev/dl/"
BUILD_TIMEOUT_S = 900.0

Say = Callable[[str], None]


class ToolMissing(StreamlabError, RuntimeError):
    """A tool the build needs (Go >= 1.23, or one that can fetch it; patch or
    git) is not on this machine; the message says what to install."""


class ToxiproxyBuildFailed(StreamlabError, RuntimeError):
    """The download or the build failed; the message quotes Go's own words."""


@dataclass(frozen=True)
class Installed:
    directory: Path
    server: Path
    cli: Path
    key: str  # version + patch hash, as scripts/build_toxiproxy.sh names a build
    built: bool  # False: that build was already there
    go: str = ""  # the Go that built it

    def as_json(self) -> dict[str, object]:
        return {"directory": str(self.directory), "server": str(self.server),
                "cli": str(self.cli), "key": self.key, "built": self.built, "go": self.go}


def build_key(patch_dir: Path | None = None) -> str:
    """VERSION-HASH: the hash of the patch and its test, as the script's KEY."""
    patch_dir = patch_dir or paths.toxiproxy_patch_dir()
    digest = hashlib.sha256((patch_dir / PATCH).read_bytes() + (patch_dir / PATCH_TEST)
                            .read_bytes()).hexdigest()
    return f"{TOXIPROXY_VERSION}-{digest[:12]}"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def parse_go_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of "go1.23.4", "go version go1.19.8 linux/amd64"; None if none."""
    found = re.search(r"go(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _install_go_hint() -> str:
    return (f"Install Go >= {GO_NEEDED[0]}.{GO_NEEDED[1]} ({GO_DOWNLOAD}; Debian 12's golang "
            f"is 1.19, too old, its bookworm-backports has 1.23: sudo apt-get install -y -t "
            f"bookworm-backports golang-go), or, with Go 1.21 or later, let Go fetch the "
            f"toolchain itself: GOTOOLCHAIN={GO_TOOLCHAIN} streamlab install toxiproxy. "
            f"(In a clone, `make up` fetches it with any Go: scripts/build_toxiproxy.sh)")


def _go_env(go: str, env: Mapping[str, str], cwd: Path, *names: str) -> list[str]:
    done = subprocess.run([go, "env", *names], capture_output=True, text=True, env=dict(env),
                          cwd=cwd, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise ToolMissing(f"`{go} env` failed (exit {done.returncode}): "
                          f"{(done.stderr or done.stdout).strip()}. {_install_go_hint()}")
    return done.stdout.splitlines()


def suitable_go(env: Mapping[str, str], cwd: Path, say: Say = _stderr) -> tuple[str, str]:
    """(the go binary, its version) when it can build Toxiproxy (module
    docstring), else ToolMissing saying what to install."""
    go = shutil.which("go", path=env.get("PATH"))
    if go is None:
        raise ToolMissing(
            "Toxiproxy is built from source with Go, and there is no `go` on PATH. "
            f"{_install_go_hint()}. (Without Toxiproxy, `streamlab check` still runs, "
            "through a hop of its own on asyncio; a lab needs it.)")
    # GOVERSION is the toolchain this environment runs: with GOTOOLCHAIN=go1.23.0
    # a Go >= 1.21 has already switched to it (and fetched it) here.
    lines = [*_go_env(go, env, cwd, "GOVERSION", "GOTOOLCHAIN"), "", ""]
    version_text, toolchain = lines[0].strip(), lines[1].strip()
    version = parse_go_version(version_text)
    if version is not None and version >= GO_NEEDED:
        return go, version_text
    if version is not None and version >= GO_SWITCHES and "auto" in toolchain:
        say(f"{go} is {version_text}: Go fetches {GO_TOOLCHAIN}, which Toxiproxy's go.mod "
            f"asks for (GOTOOLCHAIN={toolchain})")
        return go, f"{version_text} (GOTOOLCHAIN={toolchain})"
    shown = version_text or "a version it does not say"
    raise ToolMissing(
        f"Toxiproxy {TOXIPROXY_VERSION} needs Go >= {GO_NEEDED[0]}.{GO_NEEDED[1]} to build; "
        f"{go} is {shown}"
        + (f" with GOTOOLCHAIN={toolchain}, which lets it fetch none"
           if version is not None and version >= GO_SWITCHES else "")
        + f". {_install_go_hint()}")


def _patch_command(env: Mapping[str, str], patch: Path) -> list[str]:
    found = shutil.which("patch", path=env.get("PATH"))
    if found is not None:
        return [found, "-s", "-p1", "-i", str(patch)]
    git = shutil.which("git", path=env.get("PATH"))
    if git is not None:  # outside a repository `git apply` patches files like patch(1)
        return [git, "apply", "-p1", str(patch)]
    raise ToolMissing("applying the lab's patch to Toxiproxy's source needs `patch` or `git`; "
                      "install one (Debian: sudo apt-get install -y patch)")


def _run(command: list[str], env: Mapping[str, str], cwd: Path, what: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, env=dict(env), cwd=cwd,
                          timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        said = "\n".join((done.stderr + done.stdout).strip().splitlines()[-30:])
        raise ToxiproxyBuildFailed(f"{what} failed ({' '.join(command)}, exit "
                                   f"{done.returncode}):\n{said}")
    return done.stdout


def installed(directory: Path, key: str) -> bool:
    """That build's binaries and stamp are in `directory`."""
    return ((directory / f".toxiproxy-{key}").is_file()
            and all((directory / name).is_file() for name in paths.TOXIPROXY_BINARIES))


def install_toxiproxy(directory: Path | None = None, *, force: bool = False,
                      say: Say = _stderr, env: Mapping[str, str] | None = None) -> Installed:
    """Build the lab's patched Toxiproxy into `directory` (default: the user's
    cache), unless that build is there already (`force` builds it again)."""
    directory = (directory or paths.toxiproxy_install_dir()).expanduser().absolute()
    patch_dir = paths.toxiproxy_patch_dir()
    key = build_key(patch_dir)
    binaries = {name: directory / name for name in paths.TOXIPROXY_BINARIES}
    if not force and installed(directory, key):
        return Installed(directory, binaries["toxiproxy-server"], binaries["toxiproxy-cli"],
                         key, built=False)
    env = {**(os.environ if env is None else env), "CGO_ENABLED": "0"}
    # The tools first: a machine without them gets its answer before anything is made.
    go, go_version = suitable_go(env, Path(tempfile.gettempdir()), say)
    patch = _patch_command(env, patch_dir / PATCH)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-toxiproxy-", dir=directory) as work:
        root = Path(work)
        say(f"downloading {MODULE}@{TOXIPROXY_VERSION} (Go's module proxy)")
        listing = _run([go, "mod", "download", "-json", f"{MODULE}@{TOXIPROXY_VERSION}"], env,
                       root, "downloading Toxiproxy's source")
        try:
            module_dir = Path(json.loads(listing)["Dir"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ToxiproxyBuildFailed(f"`go mod download` said no source directory: "
                                       f"{listing[:500]}") from exc
        source = root / "src"
        shutil.copytree(module_dir, source)
        for path in (source, *source.rglob("*")):  # the module cache's copy is read-only
            path.chmod(path.stat().st_mode | 0o200)
        say(f"applying the lab's patch ({PATCH})")
        _run(patch, env, source, "applying the lab's patch")
        ldflags = f"-X {MODULE}.Version={TOXIPROXY_VERSION}+streamlab"
        out = root / "bin"
        out.mkdir()
        for name, package in (("toxiproxy-server", "./cmd/server"),
                              ("toxiproxy-cli", "./cmd/cli")):
            say(f"building {name} with {go_version}")
            _run([go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(out / name),
                  package], env, source, f"building {name}")
        for name, target in binaries.items():
            os.replace(out / name, target)
    for stale in directory.glob(".toxiproxy-*"):
        if stale.is_file():
            stale.unlink()
    (directory / f".toxiproxy-{key}").touch()
    return Installed(directory, binaries["toxiproxy-server"], binaries["toxiproxy-cli"], key,
                     built=True, go=go_version)
