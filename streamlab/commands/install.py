"""`streamlab install ...`: what an installed streamlab cannot carry in its wheel.

    streamlab install toxiproxy     the lab's patched Toxiproxy, built with Go
                                    into the user's cache (streamlab/lab/toxiproxy_install.py)

Exit status: 0 installed (or already there); 1 the download or build failed;
2 a tool it needs is missing (Go >= 1.23, or a Go >= 1.21 allowed to fetch it;
patch or git): the message says what to install.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from streamlab.commands.conventions import OutputConsole, fail, print_json
from streamlab.exit_codes import EXIT_UNEXPECTED, EXIT_USAGE
from streamlab.lab.toxiproxy_install import (
    TOXIPROXY_VERSION,
    ToolMissing,
    ToxiproxyBuildFailed,
    install_toxiproxy,
)
from streamlab.paths import TOXIPROXY_DIR_VAR, toxiproxy_install_dir

app = typer.Typer(help="Install what the wheel cannot carry: `install toxiproxy`.",
                  no_args_is_help=True)
console = OutputConsole()
err = OutputConsole(stderr=True)

EXIT_CODES = ("Exit status: 0 installed (or already there); 1 the download or the build "
              "failed; 2 no suitable Go (>= 1.23, or >= 1.21 allowed to fetch it), or no "
              "patch or git.")


@app.command("toxiproxy", epilog=EXIT_CODES)
def toxiproxy(
    directory: Annotated[Path | None, typer.Option(
        "--dir", help="Install here instead of the user cache (then point "
                      f"${TOXIPROXY_DIR_VAR} at it).")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Build again even if this build is installed.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Build the lab's patched Toxiproxy with Go into the user cache.

    The pinned module source (Go's module proxy) with the lab's patch, as
    static binaries where the lab, the pytest plugin and `streamlab check`
    look for them."""
    target = directory or toxiproxy_install_dir()

    def progress(line: str) -> None:
        err.print(line, markup=False, highlight=False, style="dim")

    try:
        done = install_toxiproxy(directory, force=force, say=progress)
    except ToolMissing as exc:
        fail(str(exc), EXIT_USAGE)
    except ToxiproxyBuildFailed as exc:
        fail(str(exc), EXIT_UNEXPECTED)
    if as_json:
        print_json(done.as_json())
        return
    what = "built" if done.built else "already installed"
    console.print(f"Toxiproxy {TOXIPROXY_VERSION} with the lab's patch: {what} in {target}",
                  markup=False, highlight=False)
    console.print(f"  {done.server}\n  {done.cli}", markup=False, highlight=False)
