"""The lock files under requirements/: every package the lab installs, pinned
with its hashes, compiled from pyproject.toml's dependencies and extras.

    python scripts/lock.py [--uv PATH]   regenerate them (`make lock`)
    python scripts/lock.py --check       verify them, offline (`make check-lock`,
                                         and tests/unit/test_lock.py)

    requirements/dev.lock       base + lab + plot + dev   `make test`, CI
    requirements/plot.lock      base + lab + plot         `make up PLOT=1`
    requirements/lab.lock       base + lab                `make up`, the client image
    requirements/services.lock  base                      the engine and gateway images
    requirements/hf.lock        base + hf                 STREAMLAB_WITH_HF=1, the GPU image

dev.lock is compiled first and every other lock within it (`-c`), so a
package two locks share has one version: installing hf.lock over dev.lock's
venv changes nothing that dev.lock installed. Universal (`uv pip compile
--universal`): one lock for Python 3.11 (the local venv) and 3.12 (the
images), Linux and macOS, markers where they differ.

Installing: `pip install -r requirements/X.lock` (hashes checked), then `pip
install --no-deps -e .` (the project itself, which has no hash to check).

`--check` is the freshness check, in the spirit of `gen_protos.py --check`:
each lock's header holds a digest of the pyproject lists it was compiled
from, and every direct dependency must be pinned, hashed and within its
pyproject range. It needs no network and no uv.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "requirements"
# name -> extras, in compile order (dev first: the others are compiled within it).
LOCK_EXTRAS: dict[str, tuple[str, ...]] = {
    "dev": ("lab", "plot", "dev"),
    "plot": ("lab", "plot"),
    "lab": ("lab",),
    "services": (),
    "hf": ("hf",),
}
PYTHON = "3.11"  # the oldest Python pyproject allows: markers cover the newer ones
DIGEST = re.compile(r"^# inputs-sha256: ([0-9a-f]{64})$", re.MULTILINE)
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)


def project(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, list[str]]:
    """The dependency lists: "" for the base, then each extra by name."""
    data = tomllib.loads(pyproject.read_text())["project"]
    return {"": list(data["dependencies"]), **data["optional-dependencies"]}


def requirements_of(lists: dict[str, list[str]], extras: tuple[str, ...]) -> list[str]:
    return [*lists[""], *(r for extra in extras for r in lists[extra])]


def digest(lists: dict[str, list[str]], extras: tuple[str, ...]) -> str:
    """What a lock is compiled from: the base list and its extras' lists."""
    inputs = {"": lists[""], **{extra: lists[extra] for extra in extras}}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def header(name: str, extras: tuple[str, ...], lists: dict[str, list[str]]) -> str:
    what = " + ".join(["base", *extras])
    return (f"# {name}.lock: pyproject.toml's {what}, pinned with hashes. Do not edit:\n"
            f"# `make lock` regenerates it (scripts/lock.py says how it is compiled).\n"
            f"# inputs-sha256: {digest(lists, extras)}\n")


def compile_locks(uv: str) -> None:
    lists = project()
    LOCKS.mkdir(exist_ok=True)
    for name, extras in LOCK_EXTRAS.items():
        target = LOCKS / f"{name}.lock"
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "lock.txt"
            command = [uv, "pip", "compile", "pyproject.toml", "--universal",
                       "--python-version", PYTHON, "--generate-hashes", "--no-header",
                       "--quiet", "-o", str(out)]
            command += [arg for extra in extras for arg in ("--extra", extra)]
            if name != "dev":
                command += ["-c", str(LOCKS / "dev.lock")]
            # No user or site uv config: the lock must not depend on who ran it.
            subprocess.run(command, cwd=ROOT, check=True, env={**os.environ, "UV_NO_CONFIG": "1"})
            body = out.read_text()
        target.write_text(header(name, extras, lists) + body)
        print(f"wrote {target.relative_to(ROOT)} ({len(PIN.findall(body))} packages)")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def problems(lists: dict[str, list[str]] | None = None, folder: Path = LOCKS) -> list[str]:
    """What is wrong with the locks in `folder` against pyproject's lists
    (empty: they are fresh)."""
    from packaging.requirements import Requirement

    lists = lists if lists is not None else project()
    found: list[str] = []
    for name, extras in LOCK_EXTRAS.items():
        path = folder / f"{name}.lock"
        if not path.exists():
            found.append(f"{path.name}: missing (run `make lock`)")
            continue
        text = path.read_text()
        stamp = DIGEST.search(text)
        if stamp is None or stamp.group(1) != digest(lists, extras):
            found.append(f"{path.name}: compiled from other pyproject lists than these "
                         "(run `make lock`)")
        pins: dict[str, list[str]] = {}
        for package, version in PIN.findall(text):
            pins.setdefault(_normal(package), []).append(version)
        # A pin's own block: its `--hash=` lines, up to the next pin.
        blocks = re.split(r"^(?=[A-Za-z0-9])", text, flags=re.MULTILINE)
        unhashed = [b.split()[0] for b in blocks if PIN.match(b) and "--hash=sha256:" not in b]
        if unhashed:
            found.append(f"{path.name}: no hash for {', '.join(unhashed)}")
        for line in requirements_of(lists, extras):
            requirement = Requirement(line)
            versions = pins.get(_normal(requirement.name), [])
            if not versions:
                found.append(f"{path.name}: {requirement.name} is not pinned")
            elif not any(requirement.specifier.contains(v, prereleases=True) for v in versions):
                found.append(f"{path.name}: {requirement.name}=={'/'.join(versions)} is "
                             f"outside {requirement.specifier}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="verify, offline; exit 1 if stale")
    parser.add_argument("--uv", default=os.environ.get("UV", "uv"), help="the uv to compile with")
    args = parser.parse_args()
    if args.check:
        found = problems()
        for problem in found:
            print(problem, file=sys.stderr)
        return 1 if found else 0
    compile_locks(args.uv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
