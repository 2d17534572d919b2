"""The engine's exceptions: one root, a tree its docstring draws, each keeping
the builtin base callers caught it by before the root existed."""

from __future__ import annotations

from services.engine import errors
from services.engine.backends.base import BackendError, InvalidRequest
from services.engine.detached import AttachRefused
from services.engine.errors import EngineException
from services.engine.server import BackendUnavailable, CannotListen
from tests.unit.exception_roots import exception_classes, strays


def test_every_engine_exception_derives_from_the_one_root() -> None:
    assert strays("services.engine", EngineException) == []


def test_the_docstring_draws_every_engine_exception() -> None:
    found, unimported = exception_classes("services.engine")
    names = {c.__name__ for c in found} | {n.rsplit(".", 1)[-1] for n in unimported}
    assert names >= {"BackendError", "InvalidRequest", "Replaced", "Stopped", "AttachRefused",
                     "ModelLoadError", "BackendUnavailable", "CannotListen"}
    assert errors.__doc__ is not None
    assert sorted(n for n in names if n not in errors.__doc__) == []


def test_the_builtin_bases_and_the_statuses_are_kept() -> None:
    assert issubclass(InvalidRequest, ValueError)
    assert issubclass(BackendUnavailable, RuntimeError)
    assert issubclass(CannotListen, OSError)
    assert BackendError("oom", "out of memory").status == "INTERNAL"
    assert AttachRefused("NOT_FOUND", "gone").status == "NOT_FOUND"
