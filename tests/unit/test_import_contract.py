"""The import contract ([tool.importlinter] in pyproject.toml) holds, and would
catch a crossing: a copy of the three packages with a service module that
imports the lab tool, a resume store module that imports what holds it, the
engine lease that imports the gateway's state (for types too), a lab
module that imports an experiment or the console, an experiment that imports a
command, the console that imports a command, a bench, scenario or check that
imports another family (in a function too), or a shared experiment module that
imports a family, fails `lint-imports`, naming the import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("streamlab", "services", "streamlab_protocol")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def copy_project(into: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, into / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", into / "pyproject.toml")
    return into


def lint_imports(project: Path) -> subprocess.CompletedProcess[str]:
    # The copy first on the path, ahead of the editable install of the real tree.
    # Wide enough that no import chain is wrapped across lines.
    env = {**os.environ, "PYTHONPATH": str(project), "COLUMNS": "200"}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return copy_project(tmp_path)


def test_the_tree_as_it_is_keeps_the_contract(project: Path) -> None:
    result = lint_imports(project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("module", "source", "contract", "crossing"), [
    ("services/engine/crossing.py", "from streamlab import cli\n",
     "The lab tool above the services above the protocol",
     "services.engine.crossing -> streamlab.cli"),
    ("services/gateway/crossing.py", "from services.engine import settings\n",
     "Engine, gateway and clients import none of each other",
     "services.gateway.crossing -> services.engine.settings"),
    # The resume store is handed what it needs of the app's state and the
    # lease (resume/ports.py): importing either, even for types only, closes
    # the circle again; through another module counts too (lease -> state).
    ("services/gateway/resume/crossing.py",
     "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
     "    from services.gateway.state import GatewayState\n",
     "The gateway's resume store imports nothing that holds or serves it",
     "services.gateway.resume.crossing -> services.gateway.state"),
    ("services/gateway/resume/crossing.py", "from services.gateway import lease\n",
     "The gateway's resume store imports nothing that holds or serves it",
     "services.gateway.resume.crossing -> services.gateway.lease"),
    # The lease is handed what it uses (lease.py's LeaseGateway): naming the
    # state again, even for types only, closes the lease <-> state circle.
    ("services/gateway/lease.py",
     "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
     "    from services.gateway.state import GatewayState\n",
     "The gateway's engine lease imports nothing of the state that holds it",
     "services.gateway.lease -> services.gateway.state"),
    # Inside the lab tool: the lab below the experiments below the commands.
    ("streamlab/lab/crossing.py", "from streamlab.experiments import report\n",
     "Bringing a lab up knows nothing of the experiments run on it",
     "streamlab.lab.crossing -> streamlab.experiments.report"),
    ("streamlab/experiments/crossing.py", "from streamlab.commands import scenario\n",
     "Experiments know nothing of the command line",
     "streamlab.experiments.crossing -> streamlab.commands.scenario"),
    # The console is a client of the lab: the lab starts it, with settings that
    # live in the lab (lab/console_settings.py), and imports nothing of it.
    ("streamlab/lab/crossing.py", "from streamlab.console import app\n",
     "The console is a client: nothing below it imports it",
     "streamlab.lab.crossing -> streamlab.console.app"),
    ("streamlab/console/crossing.py", "from streamlab.commands import lab\n",
     "The console knows nothing of the command line",
     "streamlab.console.crossing -> streamlab.commands.lab"),
    # Benches, scenarios and checks apart: a bench that runs a scenario's
    # measurement is handed it; an import inside a function counts too.
    ("streamlab/experiments/bench/crossing.py",
     "from streamlab.experiments.scenarios import reconnect_storm\n",
     "Benches, scenarios and checks import none of each other",
     "streamlab.experiments.bench.crossing -> streamlab.experiments.scenarios.reconnect_storm"),
    ("streamlab/experiments/scenarios/crossing.py",
     "def hidden() -> None:\n    from streamlab.experiments.check import registry\n",
     "Benches, scenarios and checks import none of each other",
     "streamlab.experiments.scenarios.crossing -> streamlab.experiments.check.registry"),
    # The renderer (which a check's verdict uses) drawing a bench's plot: a
    # shared piece importing a family, and through it a check importing a bench.
    ("streamlab/experiments/render.py",
     "\n\ndef plot() -> None:\n    from streamlab.experiments.bench import plot\n",
     "The experiments' shared pieces import no family",
     "streamlab.experiments.render -> streamlab.experiments.bench.plot"),
], ids=["service-imports-the-lab-tool", "gateway-imports-the-engine",
        "resume-store-imports-the-state-for-types", "resume-store-imports-the-lease",
        "lease-imports-the-state-for-types",
        "lab-imports-an-experiment", "experiment-imports-a-command",
        "lab-imports-the-console", "console-imports-a-command",
        "bench-imports-a-scenario", "scenario-imports-a-check-in-a-function",
        "renderer-imports-a-bench"])
def test_a_crossing_breaks_the_contract_and_is_named(
    project: Path, module: str, source: str, contract: str, crossing: str
) -> None:
    path = project / module  # a new module, or more lines at the end of one
    path.write_text((path.read_text() if path.exists() else "") + source)
    result = lint_imports(project)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{contract} BROKEN" in result.stdout
    assert crossing in result.stdout
