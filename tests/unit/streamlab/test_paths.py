"""Where streamlab finds its files, its run dir and Toxiproxy (streamlab/paths.py),
from a clone and as an installed wheel would: one answer for every entry point,
and every file the lab reads among those the wheel carries (setup.py)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from streamlab import paths
from streamlab.lab import nginx
from streamlab.lab.proxies import PROXY_NAMES, edge_proxy
from streamlab.lab.toxiproxy_install import PATCH, PATCH_TEST

ROOT = Path(__file__).resolve().parents[3]
SETUP = runpy.run_path(str(ROOT / "setup.py"), run_name="setup")  # no setup() call
LAB_DATA = set(SETUP["lab_data_files"](ROOT))


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (paths.RUN_DIR_VAR, paths.TOXIPROXY_DIR_VAR, "XDG_STATE_HOME",
                 "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def installed(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """As from a wheel: no clone around streamlab, a home of its own."""
    clean_env.setattr(paths, "clone", lambda: None)
    clean_env.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# ---- the lab's files -----------------------------------------------------------------

def test_every_file_the_lab_reads_is_one_the_wheel_carries() -> None:
    read = {paths.lab_env(), nginx.TEMPLATE, paths.toxiproxy_patch_dir() / PATCH,
            paths.toxiproxy_patch_dir() / PATCH_TEST,
            *(edge_proxy(name).template() for name in PROXY_NAMES)}
    assert {str(path.relative_to(ROOT)) for path in read} <= LAB_DATA
    assert all(path.is_file() for path in read)


def test_the_wheel_carries_what_the_sdist_manifest_includes() -> None:
    """MANIFEST.in puts setup.py's files in the sdist (the wheel is built from it)."""
    manifest = (ROOT / "MANIFEST.in").read_text()
    assert "include lab.env" in manifest
    assert "recursive-include proxies *.template" in manifest
    assert "include proxies/toxiproxy/patches/*" in manifest
    assert SETUP["PACKAGED"] == Path("streamlab") / paths.PACKAGED


def test_a_packaged_copy_wins_over_the_clone(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    package = tmp_path / "streamlab"
    (package / paths.PACKAGED).mkdir(parents=True)
    (package / paths.PACKAGED / "lab.env").write_text("STREAMLAB_HOST=127.0.0.1\n")
    monkeypatch.setattr(paths, "files", lambda name: package)
    assert paths.lab_env() == package / paths.PACKAGED / "lab.env"
    # Not packaged: the clone's.
    assert paths.data_file("proxies/nginx/nginx.conf.template") == \
        ROOT / "proxies" / "nginx" / "nginx.conf.template"


# ---- the run dir -------------------------------------------------------------------

def test_the_run_dir_of_a_clone_is_its_dot_run(clean_env: pytest.MonkeyPatch) -> None:
    assert paths.clone() == ROOT
    assert paths.run_dir() == ROOT / ".run"


def test_installed_the_run_dir_is_the_users_state_directory(
        installed: Path, tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    assert paths.run_dir() == installed / ".local" / "state" / "streamlab"
    clean_env.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert paths.run_dir() == tmp_path / "state" / "streamlab"
    clean_env.setenv("XDG_STATE_HOME", "relative/is/ignored")  # as the XDG spec says
    assert paths.run_dir() == installed / ".local" / "state" / "streamlab"


def test_the_environment_names_the_run_dir_for_every_entry_point(
        clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv(paths.RUN_DIR_VAR, str(tmp_path / "mine"))
    assert paths.run_dir() == tmp_path / "mine"
    from streamlab.lab.local import LabOptions

    assert LabOptions().run_dir == tmp_path / "mine"  # the plugin's own labs' default too


class Options:
    """What the plugin reads of pytest's config."""

    def __init__(self, **given: str | None) -> None:
        self.given = given

    def getoption(self, name: str) -> str | None:
        return self.given.get(name)


def test_the_cli_and_the_plugin_default_to_the_same_run_dir(
        clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from streamlab.commands.lab import DEFAULT_RUN_DIR
    from streamlab.pytest_plugin import lab_run_dir

    assert DEFAULT_RUN_DIR == paths.run_dir() == lab_run_dir(Options())  # type: ignore[arg-type]
    clean_env.setenv(paths.RUN_DIR_VAR, str(tmp_path / "mine"))
    assert lab_run_dir(Options()) == tmp_path / "mine"  # type: ignore[arg-type]
    given = Options(**{"--streamlab-run-dir": str(tmp_path / "given")})
    assert lab_run_dir(given) == tmp_path / "given"  # type: ignore[arg-type]


# ---- Toxiproxy ---------------------------------------------------------------------

def test_toxiproxy_from_the_clone_first(clean_env: pytest.MonkeyPatch) -> None:
    places = [where for where, _ in paths.toxiproxy_places()]
    assert places == ["the clone's .tools/bin", "the user cache"]


def test_toxiproxy_from_the_user_cache_then_path(installed: Path, tmp_path: Path,
                                                  clean_env: pytest.MonkeyPatch) -> None:
    on_path = executable(tmp_path / "path" / "toxiproxy-server")
    clean_env.setenv("PATH", str(on_path.parent))
    assert paths.find_toxiproxy() == str(on_path)
    cached = executable(installed / ".cache" / "streamlab" / "bin" / "toxiproxy-server")
    assert paths.toxiproxy_install_dir() == cached.parent
    assert paths.find_toxiproxy() == str(cached)


def test_a_named_directory_is_the_only_place_looked(installed: Path, tmp_path: Path,
                                                   clean_env: pytest.MonkeyPatch) -> None:
    executable(tmp_path / "path" / "toxiproxy-server")
    clean_env.setenv("PATH", str(tmp_path / "path"))
    clean_env.setenv(paths.TOXIPROXY_DIR_VAR, str(tmp_path / "empty"))
    with pytest.raises(paths.ToxiproxyNotFound) as missing:
        paths.find_toxiproxy()
    assert "$STREAMLAB_TOXIPROXY_DIR" in str(missing.value)
    mine = executable(tmp_path / "empty" / "toxiproxy-cli")
    assert paths.find_toxiproxy("toxiproxy-cli") == str(mine)


def test_no_toxiproxy_says_how_to_get_one(installed: Path,
                                          clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PATH", "/nonexistent")
    with pytest.raises(FileNotFoundError) as missing:
        paths.find_toxiproxy()
    said = str(missing.value)
    assert "`streamlab install toxiproxy`" in said
    assert str(paths.toxiproxy_install_dir()) in said
    assert "scripts/build_toxiproxy.sh" not in said  # no clone, no script
