"""The lock files under requirements/: every package the lab installs, pinned
with its hashes, compiled from pyproject.toml's dependencies and extras.

    python scripts/lock.py [--uv PATH]   regenerate them (`make lock`; the pins that
                                         still fit stay: delete a lock to resolve anew)
    python scripts/lock.py --check       verify them, offline (`make check-lock`,
                                         and tests/unit/test_lock.py)

    requirements/dev.lock       base + lab + plot + dev   `make test`, CI
    requirements/plot.lock      base + lab + plot         `make up PLOT=1`
    requirements/lab.lock       base + lab                `make up`, the client image
    requirements/services.lock  base                      the engine and gateway images
    requirements/hf.lock        base + hf                 STREAMLAB_WITH_HF=1, the GPU image

and the locks of what a script installs on its own (ALONE_LOCKS), each from
one list alone, without the base: a pyproject extra or a `requirements/*.in`:

    requirements/check-servers.lock  the check-servers extra  scripts/install_check_servers.sh
    requirements/proxies.lock        the proxies extra        scripts/install_proxies.sh (Traefik),
                                                              proxies/traefik/Dockerfile
    requirements/llama-server.lock   llama-server.in          scripts/install_llama_server.sh
    requirements/litellm.lock        litellm.in               scripts/install_litellm.sh (a venv
                                                              of its own: not within dev.lock)
    requirements/pip.lock            pip.in                   scripts/install.sh: pip itself, first
    requirements/uv.lock             uv.in                    `make lock`: uv, in .tools/uv

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
# name -> (its list: "extra:NAME" or a file under requirements/, the lock it is
# compiled within or None): a lock a script installs alone. Within dev.lock, a
# package that joins the lab's venv leaves every version there as it is; a
# venv of its own (LiteLLM's, whose FastAPI is not the lab's) is compiled alone.
ALONE_LOCKS: dict[str, tuple[str, str | None]] = {
    "check-servers": ("extra:check-servers", "dev"),
    "proxies": ("extra:proxies", "dev"),
    "llama-server": ("llama-server.in", "dev"),
    "litellm": ("litellm.in", None),
    "pip": ("pip.in", None),
    "uv": ("uv.in", None),
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


def alone_inputs(source: str, lists: dict[str, list[str]], folder: Path = LOCKS) -> list[str]:
    """An alone lock's requirements: its extra's list, or its file's lines."""
    if source.startswith("extra:"):
        return list(lists[source.removeprefix("extra:")])
    lines = (line.split("#")[0].strip() for line in (folder / source).read_text().splitlines())
    return [line for line in lines if line]


def alone_digest(source: str, inputs: list[str]) -> str:
    return hashlib.sha256(json.dumps({source: inputs}, sort_keys=True).encode()).hexdigest()


def compile_alone(uv: str, name: str) -> None:
    source, within = ALONE_LOCKS[name]
    inputs = alone_inputs(source, project())
    target = LOCKS / f"{name}.lock"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "lock.txt"
        if target.exists():  # as above: the pins that still fit stay
            out.write_text(target.read_text())
        # The list on stdin: no temporary path in the lock's `# via` lines.
        command = [uv, "pip", "compile", "-", "--universal", "--python-version", PYTHON,
                   "--generate-hashes", "--no-header", "--quiet", "-o", str(out)]
        if within is not None:
            command += ["-c", str(LOCKS / f"{within}.lock")]
        subprocess.run(command, cwd=ROOT, check=True, input="\n".join(inputs) + "\n",
                       text=True, env={**os.environ, "UV_NO_CONFIG": "1"})
        body = out.read_text()
    what = f"pyproject.toml's {source.removeprefix('extra:')} extra" if source.startswith(
        "extra:") else f"requirements/{source}"
    target.write_text(
        f"# {name}.lock: {what} alone (no base), pinned with hashes"
        f"{f', within {within}.lock' if within else ''}. Do not edit:\n"
        f"# `make lock` regenerates it (scripts/lock.py says how it is compiled).\n"
        f"# inputs-sha256: {alone_digest(source, inputs)}\n" + body)
    print(f"wrote {target.relative_to(ROOT)} ({len(PIN.findall(body))} packages)")


def compile_locks(uv: str, only: set[str] | None = None) -> None:
    """Every lock, or the ones named (`--only`), in compile order."""
    lists = project()
    LOCKS.mkdir(exist_ok=True)
    for name, extras in LOCK_EXTRAS.items():
        if only is not None and name not in only:
            continue
        target = LOCKS / f"{name}.lock"
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "lock.txt"
            # uv prefers the pins already in its output file: a package added to
            # pyproject changes the lock by what it brings, not by every newer
            # release since (delete the lock for a fresh resolution).
            if target.exists():
                out.write_text(target.read_text())
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
    for name in ALONE_LOCKS:
        if only is None or name in only:
            compile_alone(uv, name)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def problems(lists: dict[str, list[str]] | None = None, folder: Path = LOCKS) -> list[str]:
    """What is wrong with the locks in `folder` against pyproject's lists
    (and the `.in` files there): empty when they are fresh."""
    lists = lists if lists is not None else project()
    found: list[str] = []
    for name, extras in LOCK_EXTRAS.items():
        found += _lock_problems(folder / f"{name}.lock", digest(lists, extras),
                                requirements_of(lists, extras), "pyproject lists")
    for name, (source, _) in ALONE_LOCKS.items():
        inputs = alone_inputs(source, lists, folder)
        found += _lock_problems(folder / f"{name}.lock", alone_digest(source, inputs), inputs,
                                "inputs" if source.startswith("extra:") else source)
    return found


def _lock_problems(path: Path, expected: str, requirements: list[str], inputs: str
                   ) -> list[str]:
    from packaging.requirements import Requirement

    if not path.exists():
        return [f"{path.name}: missing (run `make lock`)"]
    found = []
    text = path.read_text()
    stamp = DIGEST.search(text)
    if stamp is None or stamp.group(1) != expected:
        found.append(f"{path.name}: compiled from other {inputs} than these (run `make lock`)")
    pins: dict[str, list[str]] = {}
    for package, version in PIN.findall(text):
        pins.setdefault(_normal(package), []).append(version)
    # A pin's own block: its `--hash=` lines, up to the next pin.
    blocks = re.split(r"^(?=[A-Za-z0-9])", text, flags=re.MULTILINE)
    unhashed = [b.split()[0] for b in blocks if PIN.match(b) and "--hash=sha256:" not in b]
    if unhashed:
        found.append(f"{path.name}: no hash for {', '.join(unhashed)}")
    for line in requirements:
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
    parser.add_argument("--only", nargs="+", metavar="LOCK",
                        help="compile only these locks (dev, check-servers, ...)")
    args = parser.parse_args()
    if args.check:
        found = problems()
        for problem in found:
            print(problem, file=sys.stderr)
        return 1 if found else 0
    compile_locks(args.uv, set(args.only) if args.only else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
