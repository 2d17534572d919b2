"""The lab tool's exceptions: one root, a tree its docstring draws, each keeping
the builtin base callers caught it by before the root existed."""

from __future__ import annotations

from streamlab import errors
from streamlab.errors import StreamlabError
from streamlab.lab.processes import StartError
from streamlab.lab.toxiproxy import ToxicSpecError, ToxiproxyError
from tests.unit.exception_roots import exception_classes, strays


def test_every_lab_tool_exception_derives_from_the_one_root() -> None:
    assert strays("streamlab", StreamlabError) == []


def test_the_docstring_draws_every_lab_tool_exception() -> None:
    found, _ = exception_classes("streamlab")
    assert len(found) > 10
    assert errors.__doc__ is not None
    assert sorted(c.__name__ for c in found if c.__name__ not in errors.__doc__) == []


def test_the_builtin_bases_are_kept() -> None:
    assert issubclass(StartError, RuntimeError)
    assert issubclass(ToxicSpecError, ValueError)
    assert str(ToxiproxyError(0, "refused")) == "toxiproxy unreachable: refused"
