"""The proxy matrix: each edge proxy x each edge probe (edge_probes.py), out of
the box and streaming-ready, or a user's own config as it is.

    run_matrix(proxies, ...)   one private lab per proxy on free ports, the
                               probes in it, the lab down again -> Matrix
    Matrix.as_json()           what `streamlab scenario matrix --json` prints
    markdown(matrix)           the table docs/proxy-matrix.md holds
    plot(matrix, path)         a coloured grid (matplotlib, the `plot` extra)

A cell's verdict: "broken" (the probe saw the failure), "ok", or "-" (not
measured: the note says why). docs/proxy-matrix.md has the full run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from streamlab.experiments.report import JSON
from streamlab.experiments.scenarios.edge_probes import (
    FORMS,
    PROBES,
    Cell,
    Form,
    Probe,
    ProbeContext,
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
from streamlab.lab.proxies import edge_proxy

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
    cells: dict[str, dict[str, Cell]] = field(default_factory=dict)  # probe -> form -> cell
    config: str | None = None  # the user's config file, when it ran one
    error: str = ""  # the lab did not come up

    def as_json(self) -> dict[str, JSON]:
        cells: dict[str, JSON] = {
            probe: {form: cell.as_json() for form, cell in by_form.items()}
            for probe, by_form in self.cells.items()}
        forms: list[JSON] = list(self.forms)
        return {"proxy": self.proxy, "version": self.version, "forms": forms,
                "config": self.config, "error": self.error, "cells": cells}

    @classmethod
    def from_json(cls, data: dict[str, JSON]) -> ProxyRow:
        cells_json = data.get("cells")
        cells: dict[str, dict[str, Cell]] = {}
        for probe, by_form in (cells_json.items() if isinstance(cells_json, dict) else []):
            if not isinstance(by_form, dict):
                continue
            cells[probe] = {}
            for form, cell in by_form.items():
                if isinstance(cell, dict):
                    broken = cell.get("broken")
                    figures = cell.get("figures")
                    cells[probe][form] = Cell(
                        broken if isinstance(broken, bool) else None,
                        {k: v for k, v in figures.items()
                         if isinstance(v, (str, int, float, bool)) or v is None}
                        if isinstance(figures, dict) else {},
                        str(cell.get("note") or ""))
        forms = data.get("forms")
        config = data.get("config")
        return cls(str(data["proxy"]), str(data.get("version") or ""),
                   tuple(f for f in ("default", "ready", "yours")
                         if isinstance(forms, list) and f in forms),
                   cells, str(config) if config else None, str(data.get("error") or ""))


@dataclass
class Matrix:
    rows: list[ProxyRow]
    probes: list[str]
    started: str = ""
    took_s: float = 0.0

    def as_json(self) -> dict[str, JSON]:
        probes: list[JSON] = list(self.probes)
        rows: list[JSON] = [row.as_json() for row in self.rows]
        fixes: dict[str, JSON] = {p.name: dict(p.fix) for p in PROBES if p.name in self.probes}
        failures: dict[str, JSON] = {p.name: p.failure for p in PROBES if p.name in self.probes}
        return {"started": self.started, "took_s": round(self.took_s, 1), "probes": probes,
                "failures": failures, "fixes": fixes, "rows": rows}

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

    @property
    def measured(self) -> bool:
        """Every cell measured (no lab failed, no probe crashed)."""
        return all(not row.error and all(cell.broken is not None or cell.note
                                         for by_form in row.cells.values()
                                         for cell in by_form.values())
                   for row in self.rows)


def verdict(cell: Cell | None) -> str:
    if cell is None or cell.broken is None:
        return "-"
    return "broken" if cell.broken else "ok"


def proxy_version(name: str) -> str:
    """The proxy's own version line (`nginx -v`, `haproxy -v`, ...)."""
    try:
        binary = edge_proxy(name).find()
    except (FileNotFoundError, StartError):
        return "not installed"
    flag = {"nginx": ["-v"], "haproxy": ["-v"], "caddy": ["version"],
            "traefik": ["version"]}[name]
    try:
        done = subprocess.run([binary, *flag], capture_output=True, text=True, timeout=10,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (done.stdout + done.stderr).strip().splitlines()
    if name == "traefik":  # "Version:      3.7.15" among other lines
        text = [line for line in text if line.lower().startswith("version")] or text
    return " ".join(text[0].split()) if text else "unknown"


async def run_probe(probe: Probe, ctx: ProbeContext, form: Form) -> Cell:
    """One probe in one form; a crash is a cell not measured, with its reason."""
    try:
        return await probe.measure(ctx, form)
    except Exception as exc:  # a probe's crash is its cell's, not the matrix's end
        return Cell(None, {}, f"probe crashed: {type(exc).__name__}: {exc}"[:200])


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
            row.cells[probe.name] = {}
            for form in forms:
                started = time.monotonic()
                cell = await run_probe(probe, ctx, form)
                row.cells[probe.name][form] = cell
                say(f"{name}: {probe.name} {form}: {verdict(cell)}"
                    f"{' (' + cell.note + ')' if cell.note else ''} "
                    f"({time.monotonic() - started:.0f} s)")
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

def cell_text(cell: Cell | None, shown: Sequence[str]) -> str:
    """`broken` / `ok`, then the probe's own figures (those it shows first)."""
    if cell is None:
        return "-"
    figures = ", ".join(f"{k} {_fmt(cell.figures[k])}" for k in shown if k in cell.figures)
    text = verdict(cell) + (f" ({figures})" if figures else "")
    return text + (f"; {cell.note}" if cell.note else "")


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def rows_for_table(matrix: Matrix) -> list[tuple[str, str, str, str, str]]:
    """(probe, proxy, out of the box / yours, streaming-ready, fixing directive)
    per probe and proxy, in the matrix's order."""
    lines = []
    shown = {p.name: p.shown for p in PROBES}
    fixes = {p.name: p.fix for p in PROBES}
    for probe in matrix.probes:
        for row in matrix.rows:
            if row.error:
                lines.append((probe, row.proxy, f"- ({headline(row.error)})", "-", ""))
                continue
            by_form = row.cells.get(probe, {})
            first: Form = "yours" if "yours" in row.forms else "default"
            first_cell = by_form.get(first)
            ready = "" if first == "yours" else cell_text(by_form.get("ready"),
                                                          shown.get(probe, ()))
            lines.append((probe, row.proxy, cell_text(first_cell, shown.get(probe, ())), ready,
                          fixes.get(probe, {}).get(row.proxy, "")))
    return lines


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
            if name != probe:
                continue
            cells = [proxy, first, fix] if yours else [proxy, first, ready, fix]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)


# Grid colours: broken red, ok green, not measured grey.
COLOURS = {"broken": "#d62728", "ok": "#2ca02c", "-": "#bbbbbb"}


def grid(matrix: Matrix) -> tuple[list[str], list[str], list[list[str]]]:
    """(row labels: probes; column labels: proxy x form; verdicts)."""
    columns = [(row, form) for row in matrix.rows for form in row.forms]
    labels = [f"{row.proxy}\n{'out of the box' if form == 'default' else form}"
              for row, form in columns]
    verdicts = [[verdict(row.cells.get(probe, {}).get(form)) if not row.error else "-"
                 for row, form in columns] for probe in matrix.probes]
    return list(matrix.probes), labels, verdicts


def plot(matrix: Matrix, path: Path) -> Path:
    """The matrix as a coloured grid (PNG); needs matplotlib (the `plot` extra)."""
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    probes, labels, verdicts = grid(matrix)
    image = [[to_rgb(COLOURS[v]) for v in line] for line in verdicts]
    figure, axes = plt.subplots(figsize=(1.3 * max(1, len(labels)) + 2,
                                         0.5 * max(1, len(probes)) + 1.5))
    axes.imshow(image, aspect="auto")
    axes.set_xticks(range(len(labels)), labels, fontsize=8)
    axes.set_yticks(range(len(probes)), probes, fontsize=9)
    axes.xaxis.tick_top()
    for y, line in enumerate(verdicts):
        for x, value in enumerate(line):
            axes.text(x, y, value, ha="center", va="center", fontsize=8, color="white")
    axes.set_title(f"streamlab proxy matrix {matrix.started}", fontsize=10, pad=36)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
