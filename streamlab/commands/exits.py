"""The exit status the experiment commands share (`scenario run`, `bench ...`,
`soak`), so a script tells a wrong verdict from a wrong invocation from a lab
that is not there:

    0  as expected        every check held (a scenario this lab cannot run is
                          shown as skipped and is no wrong verdict)
    1  not as expected    a check failed, or the run crashed
    2  usage              an unknown name or option, or a lab without a
                          capability the experiment needs (the message names it)
    3  target unreachable no lab up from the run dir, or its Toxiproxy API down

The same codes hold for every command (commands/conventions.py): "no lab" is 3
wherever a command needs one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import typer

from streamlab.commands.conventions import fail
from streamlab.commands.lab import attached
from streamlab.exit_codes import EXIT_AS_EXPECTED, EXIT_UNEXPECTED, EXIT_UNREACHABLE, EXIT_USAGE
from streamlab.experiments.report import Report
from streamlab.lab.target import LabTarget, MissingCapability, TargetUnreachable
from streamlab.lab.toxiproxy import ToxiproxyError

__all__ = ["EXIT_CODES", "EXIT_CODES_TARGETS", "EXIT_STATUS_HELP", "experiment_exits", "reach",
           "verdict_exit"]

# `streamlab --help`'s epilog: the codes, in one line (rich rewraps it).
EXIT_STATUS_HELP = (f"Exit status: {EXIT_AS_EXPECTED} as expected; {EXIT_UNEXPECTED} not as "
                    "expected (a check failed, the run crashed, a command failed); "
                    f"{EXIT_USAGE} usage (an unknown name or option, or a lab without a "
                    f"capability the command needs); {EXIT_UNREACHABLE} the lab is "
                    "unreachable (no lab up, its Toxiproxy API down). Every command "
                    "takes --json: one JSON document on stdout, an error's too.")

# The epilog of `bench` and `soak` commands (the scenario command has its own
# wording of the same codes, with skipped scenarios). One line: rich rewraps it.
_USAGE_AND_UNREACHABLE = ("2 usage (an unknown option, or a lab without a capability this "
                          "needs: the message names it); 3 the target is unreachable (no "
                          "lab up, its Toxiproxy API down).")
EXIT_CODES = ("Exit status: 0 every check as expected; 1 a check not as expected (or the "
              "run crashed); " + _USAGE_AND_UNREACHABLE)
# A bench that measures against targets instead of judging a run.
EXIT_CODES_TARGETS = ("Exit status: 0 measured (a missed target is shown, not an error); "
                      "1 the run crashed; " + _USAGE_AND_UNREACHABLE)


def reach(run_dir: Path) -> LabTarget:
    """The lab, or exit 3: attached() has said why there is none."""
    try:
        return attached(run_dir)
    except typer.Exit as exc:
        if exc.exit_code == EXIT_UNREACHABLE:
            raise
        raise typer.Exit(EXIT_UNREACHABLE) from exc


@contextmanager
def experiment_exits() -> Iterator[None]:
    """Around an experiment's run: a capability the lab lacks is exit 2 with its
    message (raised before the run starts); a lab that stops answering is exit 3."""
    try:
        yield
    except MissingCapability as exc:
        fail(str(exc), EXIT_USAGE)
    except TargetUnreachable as exc:
        fail(str(exc), EXIT_UNREACHABLE)
    except ToxiproxyError as exc:
        if exc.status_code:  # it answered and refused: the run's failure, not the lab's absence
            raise
        fail(f"{exc} (is the lab up? `streamlab status`)", EXIT_UNREACHABLE)
    except httpx.ConnectError as exc:
        fail(f"the lab does not answer: {exc} (is it up? `streamlab status`)",
             EXIT_UNREACHABLE)


def verdict_exit(report: Report) -> None:
    """Exit 0 when every check of the report (and its parts) held, else 1."""
    raise typer.Exit(EXIT_AS_EXPECTED if report.as_expected else EXIT_UNEXPECTED)
