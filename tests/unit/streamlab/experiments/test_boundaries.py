"""What the experiments promise about their own shape, read from the source:
no experiment reaches into another family's modules, and no function hands
over a dict of unknown shape."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import streamlab

PACKAGE = Path(streamlab.__file__).parent
EXPERIMENTS = PACKAGE / "experiments"
SCENARIOS = "streamlab.experiments.scenarios"


def sources(*folders: Path) -> list[Path]:
    return sorted(p for folder in folders for p in folder.rglob("*.py"))


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


OUTSIDE_SCENARIOS = [p for p in sources(EXPERIMENTS, PACKAGE / "console")
                     if (EXPERIMENTS / "scenarios") not in p.parents]


@pytest.mark.parametrize("path", OUTSIDE_SCENARIOS, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_outside_the_scenarios_only_their_package_surface_is_imported(path: Path) -> None:
    """The soak, the benches and the console take what the scenarios share from
    the package (`streamlab.experiments.scenarios`), or from a module below both
    (load_clients.py): never a family module's internals."""
    reach_ins = {m for m in imported_modules(path) if m.startswith(f"{SCENARIOS}.")}
    assert not reach_ins, f"{path.name} reaches into {sorted(reach_ins)}"


def test_the_soak_takes_its_clients_from_the_shared_module() -> None:
    modules = imported_modules(EXPERIMENTS / "soak.py")
    assert "streamlab.experiments.load_clients" in modules
    assert not {m for m in modules if m.startswith(SCENARIOS)}


def dict_str_any(node: ast.expr | None) -> bool:
    """`dict[str, Any]` anywhere in an annotation (`list[dict[str, Any]] | None` too)."""
    if node is None:
        return False
    return any(isinstance(sub, ast.Subscript) and ast.unparse(sub).replace(" ", "")
               == "dict[str,Any]" for sub in ast.walk(node))


@pytest.mark.parametrize("path", sources(EXPERIMENTS), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_takes_or_returns_a_dict_of_unknown_shape(path: Path) -> None:
    """Figures, JSON (report.py) or a TypedDict: a reader can tell what is in it."""
    offenders = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                         *filter(None, (node.args.vararg, node.args.kwarg))]
            if dict_str_any(node.returns) or any(dict_str_any(a.annotation) for a in arguments):
                offenders.append(f"{node.name} (line {node.lineno})")
    assert not offenders, offenders
