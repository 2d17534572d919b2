"""Generate the gRPC Python code from protos/ (the one reproducible command).

    python scripts/gen_protos.py            # write into the repo
    python scripts/gen_protos.py --check    # exit 1 if the committed code is stale

The proto path mirrors the Python package (`-I protos`), so the generated
modules import each other as `streamlab_protocol.engine.v1...` with no sys.path tricks.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"


def generate(out: Path) -> list[Path]:
    # mypy-protobuf's protoc plugin lives next to this interpreter (the venv's bin/).
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    protos = sorted(PROTOS.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    for proto in protos:
        args = [
            "protoc",
            f"-I{PROTOS}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            f"--mypy_grpc_out={out}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")
    generated = sorted(p for p in out.rglob("*") if p.is_file())
    # Package markers so the generated tree imports as a normal package. The
    # top-level package (`streamlab_protocol/`) holds hand-written code and owns its own.
    for directory in {p.parent for p in generated}:
        while directory.parent != out:
            (directory / "__init__.py").touch()
            directory = directory.parent
    return sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        files = generate(out)
        if args.check:
            stale = [f for f in files if not (ROOT / f).exists()
                     or not filecmp.cmp(out / f, ROOT / f, shallow=False)]
            if stale:
                print("stale generated code (run `make protos`):", *stale, sep="\n  ")
                return 1
            print(f"generated code is fresh ({len(files)} files)")
            return 0
        for f in files:
            (ROOT / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out / f, ROOT / f)
            print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
