"""The proxy matrix: each edge proxy x each edge probe (edge_probes.py), out of
the box and streaming-ready, or a user's own config as it is.

    run_matrix(proxies, ...)   one private lab per proxy on free ports, the
                               probes in it, the lab down again -> Matrix
    Matrix.as_json()           what `streamlab scenario matrix --json` prints
    markdown(matrix)           the table docs/proxy-matrix.md holds
    plot(matrix, path)         a coloured grid (matplotlib, the `plot` extra)

A cell is the probe's Report for one form (edge_probes.Probe.run): its checks
judged on its figures, in the words of every Report ("as expected",
"UNEXPECTED", "error" with the reason), drawn by render.py. The checks are
shown to discriminate as the scenarios' are (runner.py): the ready form's
Report carries them judged on the out-of-box figures (its other_checks, so
Report.discriminates: they fail out of the box). Where they fail there and
the proxy names a directive that fixes it, they must hold on the ready form,
or the run is not as expected (`undiscriminating`). docs/proxy-matrix.md has
the full run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio

from streamlab.experiments.render import colour, summary
from streamlab.experiments.report import JSON, Figures, Report, judge
from streamlab.experiments.scenarios.edge_probes import (
    FORMS,
    PROBES,
    Form,
    Probe,
    ProbeContext,
    fix_of,
    probe_fix,
    user_config_text,
)
from streamlab.experiments.scenarios.replica_lab import (
    PORT_TRIES,
    SCALE_ENGINE_ENV,
    SCALE_GATEWAY_ENV,
    free_ports,
)
from streamlab.lab.local import Lab, LabOptions
from streamlab.lab.nginx import NginxOptions
from streamlab.lab.processes import StartError
from streamlab.lab.proxies import PROXY_NAMES, edge_proxy, proxy_class

# The matrix lab's services: enough engine slots and per-client streams for
# the ceiling's ramp, answers long enough for the slow reader's flood, and
# the streaming location's timeouts (nginx's send timeout, the others' idle
# timeouts: HAProxy's `timeout client`) short enough to be seen within the
# slow reader's window, still longer than every silence the probes make. The
# gateway's own send timeout past the window: the slow reader's verdict is
# the proxy's (the gateway's cuts a stalled stream once every buffer in front
# of it is full, whatever the proxy).
MATRIX_ENGINE_ENV = {**SCALE_ENGINE_ENV, "STREAMLAB_ENGINE_MAX_TOKENS_LIMIT": "100000"}
MATRIX_GATEWAY_ENV = {**SCALE_GATEWAY_ENV, "STREAMLAB_GATEWAY_SEND_TIMEOUT_S": "120"}
MATRIX_NGINX = NginxOptions(send_timeout_s=3.0, read_timeout_s=8.0)
# A lab that did not come up: its error, kept whole up to this (a proxy's refusal
# is a few lines; the table shows one of them, `headline`).
ERROR_CHARS = 2000

Say = Callable[[str], None]


@dataclass
class ProxyRow:
    proxy: str
    version: str
    forms: tuple[Form, ...]
    cells: dict[str, dict[str, Report]] = field(default_factory=dict)  # probe -> form -> Report
    config: str | None = None  # the user's config file, when it ran one
    error: str = ""  # the lab did not come up

    def report(self, probe: str, form: Form) -> Report:
        """A cell; an error Report where the lab did not come up (its headline)."""
        reason = headline(self.error) if self.error else "not measured"
        return self.cells.get(probe, {}).get(form) or Report(probe, form, status="error",
                                                              reason=reason)

    def as_json(self) -> dict[str, JSON]:
        cells: dict[str, JSON] = {
            probe: {form: report.as_json() for form, report in by_form.items()}
            for probe, by_form in self.cells.items()}
        forms: list[JSON] = list(self.forms)
        return {"proxy": self.proxy, "version": self.version, "forms": forms,
                "config": self.config, "error": self.error, "cells": cells}

    @classmethod
    def from_json(cls, data: dict[str, JSON]) -> ProxyRow:
        """A saved row, its cells judged again on their figures."""
        cells_json = data.get("cells")
        probes = {p.name: p for p in PROBES}
        cells: dict[str, dict[str, Report]] = {}
        for name, by_form in (cells_json.items() if isinstance(cells_json, dict) else []):
            probe = probes.get(name)
            if probe is not None and isinstance(by_form, dict):
                cells[name] = proven(probe, {form: saved(probe, form, cell)
                                             for form, cell in by_form.items()
                                             if isinstance(cell, dict)})
        forms = data.get("forms")
        config = data.get("config")
        return cls(str(data["proxy"]), str(data.get("version") or ""),
                   tuple(f for f in ("default", "ready", "yours")
                         if isinstance(forms, list) and f in forms),
                   cells, str(config) if config else None, str(data.get("error") or ""))


def saved(probe: Probe, form: str, data: dict[str, JSON]) -> Report:
    """A cell's Report from its JSON (Report.as_json), its checks judged again."""
    figures_json = data.get("figures")
    figures: Figures = {k: v for k, v in figures_json.items()
                        if isinstance(v, (str, int, float, bool)) or v is None
                        } if isinstance(figures_json, dict) else {}
    status = data.get("status")
    if status not in ("skipped", "error"):
        return Report(probe.name, form, str(data.get("story") or data.get("note") or ""),
                      figures, judge(probe.checks, figures))
    return Report(probe.name, form, figures=figures, status="error" if status == "error"
                  else "skipped", reason=str(data.get("reason") or ""))


def proven(probe: Probe, by_form: Mapping[str, Report]) -> dict[str, Report]:
    """The forms' Reports, the ready one with the probe's checks judged on the
    out-of-box figures as its other_checks (when both ran): Report.discriminates
    then says the checks fail out of the box, as a scenario's other mode's
    checks must fail on its figures; with its own checks holding, the checks
    tell the broken form from the fixed one."""
    out = dict(by_form)
    default, ready = out.get("default"), out.get("ready")
    if default is not None and ready is not None and "ran" == default.status == ready.status:
        out["ready"] = replace(ready, other_checks=judge(probe.checks, default.figures))
    return out


def names_a_fix(probe: str, proxy: str) -> bool:
    """Whether the proxy has a directive that fixes the probe's failure, which
    its ready form applies (each proxy says so in its probe_fixes)."""
    found = probe_fix(probe, proxy)
    return found is not None and found.is_directive


@dataclass
class Matrix:
    rows: list[ProxyRow]
    probes: list[str]
    started: str = ""
    took_s: float = 0.0

    def as_json(self) -> dict[str, JSON]:
        probes: list[JSON] = list(self.probes)
        rows: list[JSON] = [row.as_json() for row in self.rows]
        fixes: dict[str, JSON] = {probe: {proxy: fix_of(probe, proxy) for proxy in PROXY_NAMES}
                                  for probe in self.probes}
        failures: dict[str, JSON] = {p.name: p.failure for p in PROBES if p.name in self.probes}
        undiscriminating: list[JSON] = [f"{proxy} {probe}"
                                        for proxy, probe in self.undiscriminating]
        return {"started": self.started, "took_s": round(self.took_s, 1), "probes": probes,
                "failures": failures, "fixes": fixes, "undiscriminating": undiscriminating,
                "rows": rows}

    @classmethod
    def from_json(cls, data: dict[str, JSON]) -> Matrix:
        rows = data.get("rows")
        probes = data.get("probes")
        took = data.get("took_s")
        return cls([ProxyRow.from_json(r) for r in (rows if isinstance(rows, list) else [])
                    if isinstance(r, dict)],
                   [str(p) for p in (probes if isinstance(probes, list) else [])],
                   str(data.get("started") or ""),
                   float(took) if isinstance(took, (int, float)) else 0.0)

    def cells(self) -> Iterator[tuple[ProxyRow, str, dict[str, Report]]]:
        """(row, probe, the probe's Reports by form) for each row and the matrix's probes."""
        return ((row, probe, row.cells.get(probe, {})) for row in self.rows
                for probe in self.probes)

    @property
    def measured(self) -> bool:
        """Every cell measured (no lab failed, no probe crashed)."""
        return not any(row.error for row in self.rows) and all(
            report.status == "ran" for _, _, by_form in self.cells()
            for report in by_form.values())

    @property
    def undiscriminating(self) -> list[tuple[str, str]]:
        """(proxy, probe) where the checks failed out of the box, the proxy names
        the directive that fixes it, and the ready form still fails them: the
        fix did not fix it, or the checks cannot tell the two forms apart."""
        return [(row.proxy, name) for row, name, by_form in self.cells()
                if (ready := by_form.get("ready")) is not None and ready.other_checks
                and ready.discriminates and not ready.as_expected
                and names_a_fix(name, row.proxy)]

    @property
    def yours_broken(self) -> bool:
        """A user's config failed a probe's checks."""
        return any(not report.as_expected for row, _, by_form in self.cells()
                   if "yours" in row.forms for report in by_form.values())


def proxy_version(name: str) -> str:
    """The proxy's own version line (its class's version_command)."""
    try:
        binary = edge_proxy(name).find()
    except (FileNotFoundError, StartError):
        return "not installed"
    proxy = proxy_class(name)
    try:
        done = subprocess.run(proxy.version_command(binary), capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return proxy.version_line(done.stdout + done.stderr)


async def run_proxy(name: str, probes: Sequence[Probe], *, user_config: Path | None = None,
                    say: Say = print) -> ProxyRow:
    """A private lab with `name` at its edge (and the user's config, if any),
    every probe in each form, the lab down again."""
    forms: tuple[Form, ...] = ("yours",) if user_config is not None else FORMS
    row = ProxyRow(name, proxy_version(name), forms,
                   config=str(user_config) if user_config else None)
    run_dir = Path(tempfile.mkdtemp(prefix=f"streamlab-matrix-{name}-"))
    options = LabOptions(run_dir=run_dir, nginx=MATRIX_NGINX, console=False,
                         engine_env=dict(MATRIX_ENGINE_ENV), gateway_env=dict(MATRIX_GATEWAY_ENV),
                         proxy=name, proxy_config=user_config)
    lab = Lab(free_ports(options), options)
    say(f"{name}: starting a lab on edge port {lab.ports.edge_port} ({row.version})")
    for attempt in range(PORT_TRIES):
        try:
            await anyio.to_thread.run_sync(lab.up)  # stops what it started if it fails
            break
        except (StartError, FileNotFoundError, OSError) as exc:
            # Free when checked, taken before the lab bound it (other labs on
            # this machine pick ports in the same range): other ports.
            if "in use" in str(exc) and attempt < PORT_TRIES - 1:
                lab = Lab(free_ports(options), options)
                say(f"{name}: a port was taken meanwhile; again on {lab.ports.edge_port}")
                continue
            # Whole: a proxy's refusal is its own words, below streamlab's first line.
            row.error = str(exc).strip()[:ERROR_CHARS]
            say(f"{name}: the lab did not come up: {row.error}")
            shutil.rmtree(run_dir, ignore_errors=True)
            return row
    try:
        ctx = ProbeContext(lab, name, user_config_text(lab))
        for probe in probes:
            by_form: dict[str, Report] = {}
            for form in forms:
                started = time.monotonic()
                by_form[form] = await probe.run(ctx, form)
                say(f"{name}: {probe.name} {form}: {summary(by_form[form])} "
                    f"({time.monotonic() - started:.0f} s)")
            row.cells[probe.name] = proven(probe, by_form)
    finally:
        await anyio.to_thread.run_sync(lambda: lab.down(grace_s=2.0))
        shutil.rmtree(run_dir, ignore_errors=True)
        say(f"{name}: lab down")
    return row


async def run_matrix(proxies: Sequence[str], probes: Sequence[Probe], *,
                     user_config: Path | None = None, say: Say = print) -> Matrix:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    clock = time.monotonic()
    rows = [await run_proxy(name, probes, user_config=user_config, say=say) for name in proxies]
    return Matrix(rows, [p.name for p in probes], started, time.monotonic() - clock)


# A line of a proxy's refusal that says what is wrong (nginx's [emerg], HAProxy's
# [ALERT], Caddy's "Error:", Traefik's ERR), not a notice before it.
_ERROR_LINE = re.compile(r"\[(emerg|alert|crit)\]|\berr(or)?\b|\bfatal\b", re.IGNORECASE)


def headline(error: str) -> str:
    """A row's error in one line for a table cell: the first line of the cause's
    own words (a proxy's refusal, below streamlab's line that names the command)
    that says what is wrong, else the first of them, else the only line."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    words = lines[1:]
    said = next((line for line in words if _ERROR_LINE.search(line)), None)
    return (said or (words[0] if words else lines[0] if lines else ""))[:300]


def stderr_say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ---- rendering ---------------------------------------------------------------------

def rows_for_table(matrix: Matrix) -> list[tuple[str, str, Report, Report | None, str]]:
    """(probe, proxy, out of the box / yours, streaming-ready, fixing directive)
    per probe and proxy, in the matrix's order; render.summary writes a cell."""
    lines = []
    for probe in matrix.probes:
        for row in matrix.rows:
            first: Form = "yours" if "yours" in row.forms else "default"
            ready = None if first == "yours" else row.report(probe, "ready")
            lines.append((probe, row.proxy, row.report(probe, first), ready,
                          fix_of(probe, row.proxy)))
    return lines


def shown(probe: str) -> tuple[str, ...]:
    """The figures a cell shows of `probe`."""
    return next((p.shown for p in PROBES if p.name == probe), ())


def markdown(matrix: Matrix) -> str:
    """The matrix in Markdown: a section per failure (its heading an anchor a
    page can point at: `proxy-matrix.md#compression`), a row per proxy."""
    yours = any("yours" in row.forms for row in matrix.rows)
    head = (["proxy", "your config", "fixing directive"] if yours else
            ["proxy", "out of the box", "streaming-ready", "fixing directive"])
    failures = {p.name: p.failure for p in PROBES}
    out: list[str] = []
    lines = rows_for_table(matrix)
    for probe in matrix.probes:
        out += [f"### {probe}", "", failures.get(probe, "") + ".", "",
                "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, proxy, first, ready, fix in lines:
            if name == probe:
                cells = [proxy, *(summary(r, shown(probe)) for r in (first, ready) if r), fix]
                out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)


# Grid colours (render.colour): as expected, not, not measured.
COLOURS = {"green": "#2ca02c", "red": "#d62728", "yellow": "#bbbbbb"}


def grid(matrix: Matrix) -> tuple[list[str], list[str], list[list[Report]]]:
    """(row labels: probes; column labels: proxy x form; the cells' Reports)."""
    columns = [(row, form) for row in matrix.rows for form in row.forms]
    labels = [f"{row.proxy}\n{'out of the box' if form == 'default' else form}"
              for row, form in columns]
    return list(matrix.probes), labels, [[row.report(probe, form) for row, form in columns]
                                         for probe in matrix.probes]


def plot(matrix: Matrix, path: Path) -> Path:
    """The matrix as a coloured grid (PNG); needs matplotlib (the `plot` extra)."""
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    probes, labels, reports = grid(matrix)
    image = [[to_rgb(COLOURS[colour(r)]) for r in line] for line in reports]
    figure, axes = plt.subplots(figsize=(1.3 * max(1, len(labels)) + 2,
                                         0.5 * max(1, len(probes)) + 1.5))
    axes.imshow(image, aspect="auto")
    axes.set_xticks(range(len(labels)), labels, fontsize=8)
    axes.set_yticks(range(len(probes)), probes, fontsize=9)
    axes.xaxis.tick_top()
    for y, line in enumerate(reports):
        for x, report in enumerate(line):
            axes.text(x, y, report.verdict, ha="center", va="center", fontsize=8,
                      color="white")
    axes.set_title(f"streamlab proxy matrix {matrix.started}", fontsize=10, pad=36)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
