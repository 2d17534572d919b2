"""One convention for every `streamlab` command (docs/cli.md says it for users):

- `--json` on every command: its result as one JSON document on stdout, and a
  failure as one too, usage errors and "no lab" included:
  `{"error": {"kind": ..., "message": ...}, "exit_status": N}` on stdout, the
  message on stderr. A command that printed its document and then failed (a
  verdict not as expected) prints nothing more: still one document.
- One exit status per outcome, for every command: 0 as expected, 1 not as
  expected or failed, 2 usage, 3 no lab (or its Toxiproxy API down), 130
  interrupted (streamlab/exit_codes.py names them). A command says why it
  gives up with `fail(message, code)`.
- Help that fits 80 columns: a flag shows no `<bool>` metavar, and an option
  shows its first long name only. The others are the names it had before one
  name per concept (`--path` before `--location`, ...): still accepted, for a
  release, with a note on stderr, and never shown.

`apply(app)` (streamlab/cli.py, last) makes every command a StreamlabCommand
and every group a StreamlabGroup. A command may give its own error document
(`streamlab check` does: StreamlabCommand.error_document).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn, TextIO

import typer
from rich.columns import Columns
from rich.console import Console, ConsoleDimensions, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text
from typer import rich_utils

# Typer 0.29 carries its own click: its parser raises that click's errors.
from typer._click.core import Context
from typer._click.exceptions import BadParameter, ClickException, UsageError
from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.exceptions import Exit

from streamlab.errors import StreamlabError
from streamlab.exit_codes import EXIT_INTERRUPTED, EXIT_UNEXPECTED, EXIT_UNREACHABLE, EXIT_USAGE

KINDS = {EXIT_USAGE: "usage", EXIT_UNREACHABLE: "unreachable",
         EXIT_INTERRUPTED: "interrupted"}

# With no terminal anywhere (CI, cron, a pipe from a script) rich lays tables
# out at 80 columns and cuts their cells ("res…", "60/…"): there a table is
# read as data, so it gets the room it needs. A terminal's width, or COLUMNS
# when set (the help tests set it), still wins.
NO_TERMINAL_WIDTH = 200


class OutputConsole(Console):
    """A rich Console that does not cut a table to 80 columns when no standard
    stream is a terminal (NO_TERMINAL_WIDTH there)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if (self._width is None and not self.is_terminal and "COLUMNS" not in self._environ
                and not any_terminal()):
            return ConsoleDimensions(max(size.width, NO_TERMINAL_WIDTH), size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


def any_terminal() -> bool:
    """Whether rich found a terminal's size on a standard stream (as it looks)."""
    for descriptor in (0, 1, 2):
        try:
            os.get_terminal_size(descriptor)
        except (AttributeError, ValueError, OSError):  # not a terminal
            continue
        return True
    return False


err = OutputConsole(stderr=True)

# Every command takes it (a failure's document included).
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]


# What a command did not turn into a failure of its own: the lab's errors (a
# service that did not start, a proxy that refused its config) and the
# operating system's. Said in one line (and as the --json error document),
# exit 1, not a traceback; STREAMLAB_TRACEBACK=1 shows the traceback.
UNFORESEEN = (StreamlabError, OSError)
TRACEBACK_VAR = "STREAMLAB_TRACEBACK"


def unforeseen(exc: BaseException) -> str:
    return (f"{type(exc).__name__}: {exc} (set {TRACEBACK_VAR}=1 for the traceback)")


class CommandFailed(StreamlabError, ClickException):
    """A command gives up: the message goes to stderr (and into the JSON
    document under --json), the exit status is `exit_code`."""

    def __init__(self, message: str, exit_code: int = EXIT_UNEXPECTED,
                 kind: str | None = None) -> None:
        ClickException.__init__(self, message)
        self.exit_code = exit_code
        self.kind = kind or KINDS.get(exit_code, "failed")


def fail(message: str, code: int = EXIT_UNEXPECTED, kind: str | None = None) -> NoReturn:
    """Give up with `message` (plain text, never markup) and exit `code`."""
    raise CommandFailed(message, code, kind)


def error_document(kind: str, message: str, code: int) -> dict[str, Any]:
    """What --json prints when a command fails before it has a result."""
    return {"error": {"kind": kind, "message": message}, "exit_status": code}


def print_json(document: Any) -> None:
    print(json.dumps(document, indent=2, default=str))


def wants_json(args: Sequence[str]) -> bool:
    """`--json` among the options (not after `--`, where another tool's arguments go)."""
    options = args[:args.index("--")] if "--" in args else args
    return "--json" in options


def split_list(values: Sequence[str] | None, default: Sequence[str] = ()) -> list[str]:
    """A list option, given either way: repeated (`--wire a --wire b`) or
    comma-separated (`--wire a,b`), or both; none given is `default`."""
    items = [item.strip() for value in values or () for item in value.split(",")]
    return [item for item in items if item] or list(default)


def plot_extra(plot: Path | None) -> Path | None:
    """A `--plot` option's callback: it needs matplotlib, the `plot` extra, which
    `make up` leaves out unless asked: say so before the run, not after."""
    if plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise typer.BadParameter("needs matplotlib: `make up PLOT=1`, or "
                                 ".venv/bin/pip install -e '.[plot]'")
    return plot


# ---- help within 80 columns ----------------------------------------------------------
def visible_opts(opts: Sequence[str]) -> list[str]:
    """An option's names as help shows them: the first long one and the short ones."""
    longs = [o for o in opts if o.startswith("--")]
    return [*longs[:1], *(o for o in opts if not o.startswith("--"))]


def aliases(param: Any) -> list[str]:
    """The old names of an option: its long names after the first."""
    if not isinstance(param, TyperOption):
        return []
    return [o for o in param.opts if o.startswith("--")][1:]


class _WholeNames(Table):
    """The table typer draws an options (or commands) panel with, where only the
    last column, the help, wraps: rich would otherwise shrink the names and
    types with it and cut them (`--nginx-send-time…`) at 80 columns."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        super().add_row(*renderables, **kwargs)
        for column in self.columns[:-1]:
            column.no_wrap = True
        # A long word of the help (a URL, a path) wraps, never cut.
        help_ = renderables[-1] if renderables else None
        for part in help_.renderables if isinstance(help_, Columns) else [help_]:
            if isinstance(part, Text):
                part.overflow = "fold"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # A column no row fills (no short names, no --no-x) still takes its
        # padding: two columns the help has not got.
        self.columns = [c for c in self.columns if any(_filled(cell) for cell in c._cells)]
        for index, column in enumerate(self.columns):
            column._index = index
        yield from super().__rich_console__(console, options)


def _filled(cell: Any) -> bool:
    return bool(cell.plain if isinstance(cell, Text) else cell)


@contextmanager
def tidy_help(command: Any, ctx: Context) -> Iterator[None]:
    """While help is drawn: names and types never cut (_WholeNames), old names
    hidden, no `<bool>` for a flag, `<int>` for `<int range>` (the range is
    shown beside it), `<list>` for `<list[str]>`: every character of those
    columns is one the help loses."""
    saved = []
    for param in command.get_params(ctx):
        if not isinstance(param, TyperOption):
            continue
        saved.append((param, param.opts, param.metavar))
        param.opts = visible_opts(param.opts)
        if param.metavar is None and param.is_flag:
            param.metavar = ""
        elif param.metavar is None and param.type_descriptor.is_ranged:
            param.metavar = f"<{param.type_descriptor.ranged_type_name}>"
        elif param.metavar is None and param.type_descriptor.is_list:
            param.metavar = "<list>"  # repeated or comma-separated (split_list)
    names = vars(rich_utils)  # its Table, swapped while help is drawn
    table, names["Table"] = names["Table"], _WholeNames
    try:
        yield
    finally:
        names["Table"] = table
        for param, opts, metavar in saved:
            param.opts, param.metavar = opts, metavar


# ---- --json on every path --------------------------------------------------------------
class _Watched:
    """stdout or stderr, remembering what went through it: whether a document
    was printed, and the last words a failure wrote (its message)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.text = ""

    def write(self, text: str) -> int:
        self.text = (self.text + text)[-4000:]
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextmanager
def _watched() -> Iterator[tuple[_Watched, _Watched]]:
    out, error = _Watched(sys.stdout), _Watched(sys.stderr)
    sys.stdout, sys.stderr = out, error
    try:
        yield out, error
    finally:
        sys.stdout, sys.stderr = out.stream, error.stream


def say_failure(message: str) -> None:
    err.print(message, style="red", markup=False, highlight=False, soft_wrap=True)


def _hide_aliases(exc: BadParameter) -> None:
    """A bad value names its option by its name, not its old ones too."""
    if exc.param is not None and exc.param_hint is None and aliases(exc.param):
        exc.param_hint = visible_opts(exc.param.opts)[:1]


class StreamlabCommand(TyperCommand):
    """Every leaf command (apply() sets it): the conventions above."""

    def error_document(self, args: Sequence[str], kind: str, message: str,
                       code: int) -> dict[str, Any]:
        """The document --json prints on a failure; a command may give its own."""
        return error_document(kind, message, code)

    def takes_json(self, ctx: Context) -> bool:
        return any(ctx.params.get(p.name or "") for p in self.params
                   if isinstance(p, TyperOption) and "--json" in p.opts)

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        given = self._args = list(args)  # the parser consumes `args`
        self._note_aliases(given)
        try:
            return super().parse_args(ctx, args)
        except UsageError as exc:
            if isinstance(exc, BadParameter):
                _hide_aliases(exc)
            if not wants_json(given) or not any("--json" in getattr(p, "opts", ())
                                                for p in self.params):
                raise
            self._report(given, "usage", exc.format_message(), EXIT_USAGE, printed=False)
            ctx.exit(EXIT_USAGE)

    def _note_aliases(self, args: Sequence[str]) -> None:
        given = {a.split("=", 1)[0] for a in (args[:args.index("--")] if "--" in args
                                              else args)}
        for param in self.params:
            for old in aliases(param):
                if old in given:
                    err.print(f"note: {old} is now {param.opts[0]} (the old name goes in "
                              "a later release)", markup=False, highlight=False, style="dim")

    def _report(self, args: Sequence[str], kind: str, message: str, code: int, *,
                printed: bool) -> None:
        """The failure's message on stderr; under --json its document on stdout,
        unless the command printed its document already."""
        say_failure(message)
        if not printed:
            print_json(self.error_document(args, kind, message, code))

    def invoke(self, ctx: Context) -> Any:
        if not self.takes_json(ctx):
            try:
                return super().invoke(ctx)
            except CommandFailed as exc:
                say_failure(exc.message)
                raise Exit(exc.exit_code) from None
            except UNFORESEEN as exc:
                if os.environ.get(TRACEBACK_VAR):
                    raise
                say_failure(unforeseen(exc))
                raise Exit(EXIT_UNEXPECTED) from None
        args = getattr(self, "_args", [])
        with _watched() as (out, error):
            try:
                return super().invoke(ctx)
            except CommandFailed as exc:
                failure = (exc.kind, exc.message, exc.exit_code)
            except UNFORESEEN as exc:
                if os.environ.get(TRACEBACK_VAR):
                    raise
                failure = ("failed", unforeseen(exc), EXIT_UNEXPECTED)
            except UsageError as exc:
                failure = ("usage", exc.format_message(), EXIT_USAGE)
            except (Exit, SystemExit) as exc:
                code = exc.exit_code if isinstance(exc, Exit) else exc.code
                if not code or out.text:  # success, or a failure after its document
                    raise
                code = code if isinstance(code, int) else EXIT_UNEXPECTED
                said = error.text.strip().splitlines()
                failure = (KINDS.get(code, "failed"),
                           said[-1] if said else f"exit status {code}", code)
                # It said why on stderr already: the document only.
                print_json(self.error_document(args, *failure))
                raise Exit(code) from None
            except KeyboardInterrupt:
                failure = ("interrupted", "interrupted", EXIT_INTERRUPTED)
            printed = bool(out.text.strip())
        self._report(args, *failure, printed=printed)
        raise Exit(failure[2])

    def format_help(self, ctx: Context, formatter: Any) -> None:
        with tidy_help(self, ctx):
            super().format_help(ctx, formatter)

    def shell_complete(self, ctx: Context, incomplete: str) -> list[Any]:
        """Completion offers each option by its one name: the old names are
        accepted but never shown (`--rep` gave `--repeat --reps`)."""
        old = {name for param in self.params for name in aliases(param)}
        return [item for item in super().shell_complete(ctx, incomplete)
                if item.value not in old]


class StreamlabGroup(TyperGroup):
    """Every group: help within 80 columns, and its own usage errors (an
    unknown command) as a JSON document under --json."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        given = list(args)  # the parser consumes `args`
        try:
            return super().parse_args(ctx, args)
        except UsageError as exc:
            self._usage_error(given, exc)
            raise

    def resolve_command(self, ctx: Context, args: list[str]) -> Any:
        given = list(args)
        try:
            return super().resolve_command(ctx, args)
        except UsageError as exc:
            self._usage_error(given, exc)
            raise

    @staticmethod
    def _usage_error(args: Sequence[str], exc: UsageError) -> None:
        if wants_json(args):
            say_failure(exc.format_message())
            print_json(error_document("usage", exc.format_message(), EXIT_USAGE))
            raise Exit(EXIT_USAGE) from None

    def format_help(self, ctx: Context, formatter: Any) -> None:
        with tidy_help(self, ctx):
            super().format_help(ctx, formatter)


def apply(app: typer.Typer) -> typer.Typer:
    """Every command of `app` a StreamlabCommand, every group a StreamlabGroup
    (unless one asked for a class of its own)."""
    app.info.cls = app.info.cls if _own_class(app.info.cls) else StreamlabGroup
    for command in app.registered_commands:
        if not _own_class(command.cls):
            command.cls = StreamlabCommand
    for group in app.registered_groups:
        if group.typer_instance is not None:
            apply(group.typer_instance)
        group.cls = StreamlabGroup
    return app


def _own_class(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, (StreamlabCommand, StreamlabGroup))
