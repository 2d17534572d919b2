"""Draws docs/results/scenario-plots/: a scenario of each family whose measure
records token arrivals, broken above fixed, on a real lab of its own.

    .venv/bin/python scripts/scenario_plots.py [NAME ...] [--out DIR]
    make scenario-plots

The lab runs on free ports in a temporary run dir (so it never meets a lab
that `make up` started), and each plot is what a user gets from
`streamlab scenario run NAME --plot FILE --run-dir RUN_DIR`: the command runs
as a real process. Exits 1 if a scenario's verdict was not as expected (its
plot is still written, and shows why).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from streamlab.lab.local import Lab, LabOptions
from streamlab.lab.processes import free_ports
from streamlab.lab.topology import Ports

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "scenario-plots"
# One a family (registry.FAMILIES) whose measure records arrivals: the SSE
# stream (catalogue), the client that leaves (lifecycle), the cut stream
# (resume), the broken engine hop (engine_faults), the Responses surface.
SCENARIOS = ("buffering", "idle-cut", "abandoned-tab", "resume", "engine-reset",
             "responses-resume")


def lab_on_free_ports(run_dir: Path) -> Lab:
    names = [name for name in Ports.model_fields if name.endswith("_port")]
    ports = Ports.model_validate(
        {"host": "127.0.0.1", **dict(zip(names, free_ports(len(names)), strict=True))})
    return Lab(ports, LabOptions(run_dir=run_dir))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=list(SCENARIOS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    with tempfile.TemporaryDirectory(prefix="streamlab-plots-") as tmp:
        lab = lab_on_free_ports(Path(tmp) / "lab")
        lab.up()
        try:
            for name in args.names:
                png = args.out / f"{name}.png"
                print(f"{name} -> {png.relative_to(ROOT) if png.is_relative_to(ROOT) else png}",
                      flush=True)
                run = subprocess.run(
                    [sys.executable, "-m", "streamlab", "scenario", "run", name,
                     "--plot", str(png), "--run-dir", str(lab.run_dir)], cwd=ROOT)
                if run.returncode != 0:
                    failed.append(name)
        finally:
            lab.down()
    if failed:
        print(f"not as expected: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
