"""ARCHITECTURE.md's module tables match the tree: every module of the lab tool
and the services (generated code and package __init__ files aside) is named
on the page, and every module the page names exists.

A module counts as named when the page writes its path, or the end of it, as
a word of its own: `services/gateway/lease.py`, `lab/target.py`, or `lease.py`
in the gateway's table. A path the page writes that no module ends with is a
module that moved or is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "ARCHITECTURE.md"
TREES = ("streamlab", "services")
# A module path as the page writes it: word characters and slashes, then .py.
MODULE_WORD = re.compile(r"(?<![\w/.])([\w/]*\w\.py)\b")


def modules(root: Path) -> list[str]:
    """The tree's modules, relative to the repo: no __init__, no generated code."""
    return sorted(
        str(path.relative_to(root))
        for tree in TREES for path in (root / tree).rglob("*.py")
        if path.name != "__init__.py" and "_pb2" not in path.name
        and "__pycache__" not in path.parts)


def named(text: str) -> set[str]:
    return set(MODULE_WORD.findall(text))


def suffixes(module: str) -> set[str]:
    parts = module.split("/")
    return {"/".join(parts[i:]) for i in range(len(parts))}


def unnamed(text: str, tree: list[str]) -> list[str]:
    words = named(text)
    return [m for m in tree if not suffixes(m) & words]


def gone(text: str, tree: list[str], root: Path) -> list[str]:
    """Paths the page names that no module of the repo is, or ends with."""
    every = {s for m in tree for s in suffixes(m)} | {
        s for path in root.rglob("*.py") if ".venv" not in path.parts
        for s in suffixes(str(path.relative_to(root)))}
    return sorted(w for w in named(text) if w not in every)


def test_every_module_is_named_on_the_page() -> None:
    missing = unnamed(PAGE.read_text(encoding="utf-8"), modules(ROOT))
    assert not missing, f"modules ARCHITECTURE.md does not name (add them to its tables): {missing}"


def test_every_module_the_page_names_exists() -> None:
    stale = gone(PAGE.read_text(encoding="utf-8"), modules(ROOT), ROOT)
    assert not stale, f"modules ARCHITECTURE.md names that are not in the tree: {stale}"


def test_the_checks_catch_a_new_module_and_a_gone_one(tmp_path: Path) -> None:
    (tmp_path / "services" / "gateway").mkdir(parents=True)
    (tmp_path / "streamlab").mkdir()
    for module in ("services/gateway/lease.py", "services/gateway/new.py",
                   "services/gateway/__init__.py", "streamlab/cli.py"):
        (tmp_path / module).write_text("")
    page = "`services/gateway/lease.py`, and the lab tool's `cli.py`; `gateway/gone.py`\n"
    tree = modules(tmp_path)
    assert unnamed(page, tree) == ["services/gateway/new.py"]
    assert gone(page, tree, tmp_path) == ["gateway/gone.py"]
