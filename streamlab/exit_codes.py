"""The exit statuses of every `streamlab` command, defined once.

    0    EXIT_AS_EXPECTED  as expected: every check held (or is n/a)
    1    EXIT_UNEXPECTED   not as expected: a check failed, a run crashed, a
                           command gave up
    2    EXIT_USAGE        usage: an unknown name or option, a lab without a
                           capability the command needs
    3    EXIT_UNREACHABLE  the lab (its Toxiproxy API) or a checked server does
                           not answer
    130  EXIT_INTERRUPTED  interrupted (Ctrl-C, SIGTERM)

It imports nothing, so every layer may import it: the commands pick the status
(commands/conventions.py, commands/exits.py), and an experiment that writes it
into its own document (check/verdict.py: the --json's exit_status) uses the
same numbers.
"""

from __future__ import annotations

EXIT_AS_EXPECTED = 0
EXIT_UNEXPECTED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130
