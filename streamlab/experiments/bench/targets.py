"""`streamlab bench scale`'s targets: the lab's own cost, one row each, measured /
target / met, in one table ("targets"), each a Check that can fail.

    set-up    gateway <= 1.0 ms and engine <= 0.3 ms of CPU per stream (cell d)
    slow      5,000 slow streams opened over 10 s through the full chain: all
              complete, TTFT p99 <= 1 s, heartbeat lateness p99 <= 500 ms,
              gateway <= 40 KiB per stream (cell c, its admission "on" mode
              when it ran)
    paced     100 streams x 20 ms through the full chain (cell a, the batched
              clock): the lab's processes (client not counted) <= 200 µs of CPU
              per paced token together, measured while all 100 run (the steady
              window: a stream's set-up is priced by its own row, and over the
              whole cell a 100-token stream would charge each token a hundredth
              of it; that figure is printed beside, not judged); inter-chunk
              p50 20 +- 1 ms, p99 <= 30 ms
    storm     N resumable streams (2,000) cut at once at the edge: every cut
              stream's next token within 5 s of the restore, none lost, every
              token exactly once (cell e: the reconnect-storm scenario's
              measurement, its fixed mode, on its own private lab: the
              scenario's `fixed_storm`, which the command hands to bench_scale)
    cancel    cancel p99 <= 50 ms with 1,000 streams running, on both engine
              wires (cell f: `bench cancel --wire both --background 1000`)

A cell that did not run has no rows: the table judges what was measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.gateway.settings import ENGINE_WIRES
from streamlab.experiments.report import Check, Figure, Figures, Report, Table, judge

SETUP_MS = {"gateway": 1.0, "engine": 0.3}
PACED_STREAMS = 100
PACED_LAB_US_PER_TOKEN = 200.0
PACED_ICL_P50_MS = (19.0, 21.0)
PACED_ICL_P99_MS = 30.0
STORM_NEXT_TOKEN_S = 5.0
CANCEL_P99_MS = 50.0
# The lab's processes in a cadence cell's figures (the client is the bench).
LAB_PROCESSES = ("engine", "toxiproxy", "toxiproxy-backend", "gateway", "nginx")


@dataclass(frozen=True)
class Cells:
    """Each cell's report (None: not run)."""

    setup: Report | None = None
    cadence: Report | None = None
    slow: Report | None = None
    storm: Report | None = None
    cancel: Report | None = None


def _lab_sum(figures: Mapping[str, Figure], prefix: str) -> float | None:
    """A per-process figure summed over the lab's processes (None unless all are known)."""
    per = [figures.get(f"{prefix}_{name}") for name in LAB_PROCESSES]
    known = [float(v) for v in per if isinstance(v, int | float)]
    return round(sum(known), 1) if len(known) == len(per) else None


def paced_figures(cadence: Report) -> Figures | None:
    """The paced target's cell: the batched clock at 100 streams (else any clock
    at 100), with the lab's CPU per token summed over its processes: per
    running token (judged) and over the whole cell, set-ups included."""
    cells = [p for p in cadence.parts if p.figures.get("streams") == PACED_STREAMS]
    cells.sort(key=lambda p: p.figures.get("clock") != "batched")
    if not cells:
        return None
    figures = cells[0].figures
    return {"paced_clock": figures.get("clock"), "paced_completed": figures.get("completed"),
            "paced_icl_ms_p50": figures.get("icl_ms_p50"),
            "paced_icl_ms_p99": figures.get("icl_ms_p99"),
            "paced_running_tokens": figures.get("running_tokens"),
            "paced_lab_us_per_running_token": _lab_sum(figures, "us_per_running_token"),
            "paced_lab_us_per_token": _lab_sum(figures, "us_per_token")}


def _prefixed(prefix: str, figures: Mapping[str, Figure], names: tuple[str, ...]) -> Figures:
    return {f"{prefix}_{name}": figures.get(name) for name in names}


def _floor_note(setup: Report, name: str) -> str:
    """The gRPC floor measured beside a set-up figure (bench setup's floor cell)."""
    floor = setup.figures.get(f"floor_ms_{name}")
    return f" (bare gRPC floor {floor:g})" if isinstance(floor, int | float) else ""


def target_figures(cells: Cells) -> tuple[Figures, list[Check]]:
    """The figures the targets judge, flat and prefixed by cell, and their checks
    (only for the cells that ran)."""
    figures: Figures = {}
    checks: list[Check] = []
    if cells.setup is not None:
        figures.update({f"setup_ms_{n}": cells.setup.figures.get(f"setup_ms_{n}")
                        for n in SETUP_MS})
        checks += [Check(f"setup_ms_{name}", "<=", bound,
                         f"set-up: {name} CPU per stream, ms{_floor_note(cells.setup, name)}")
                   for name, bound in SETUP_MS.items()]
    if cells.slow is not None:
        slow = cells.slow.figures
        streams = slow.get("streams")
        figures.update(_prefixed("slow", slow, (
            "streams", "admission", "completed", "ttft_ms_p99", "heartbeat_late_ms_p99",
            "gateway_kib_per_stream")))
        checks += [Check("slow_completed", "==", streams if streams is not None else -1,
                         f"slow: all {streams} streams (10 s ramp) complete"),
                   Check("slow_ttft_ms_p99", "<=", 1000, "slow: TTFT p99, ms"),
                   Check("slow_heartbeat_late_ms_p99", "<=", 500,
                         "slow: heartbeat lateness p99, ms"),
                   Check("slow_gateway_kib_per_stream", "<=", 40.0,
                         "slow: gateway memory per stream, KiB")]
    paced = paced_figures(cells.cadence) if cells.cadence is not None else None
    if paced is not None:
        figures.update(paced)
        whole = paced.get("paced_lab_us_per_token")
        beside = f" (whole cell, set-ups included: {whole:g})" if isinstance(
            whole, int | float) else ""
        checks += [Check("paced_lab_us_per_running_token", "<=", PACED_LAB_US_PER_TOKEN,
                         "paced 100 x 20 ms: the lab's CPU per running token, µs, all "
                         f"processes{beside}"),
                   Check("paced_icl_ms_p50", ">=", PACED_ICL_P50_MS[0],
                         "paced: inter-chunk p50 at least 19 ms"),
                   Check("paced_icl_ms_p50", "<=", PACED_ICL_P50_MS[1],
                         "paced: inter-chunk p50 at most 21 ms"),
                   Check("paced_icl_ms_p99", "<=", PACED_ICL_P99_MS,
                         "paced: inter-chunk p99, ms")]
    if cells.storm is not None:
        storm = cells.storm.figures
        streams = storm.get("streams")
        figures.update(_prefixed("storm", storm, (
            "streams", "cut_streams", "lost", "next_token_s", "complete_exactly_once",
            "duplicates")))
        checks += [Check("storm_lost", "==", 0, "storm: every cut stream back"),
                   Check("storm_next_token_s", "<=", STORM_NEXT_TOKEN_S,
                         "storm: every cut stream's next token, s after the restore"),
                   Check("storm_complete_exactly_once", "==",
                         streams if streams is not None else -1,
                         f"storm: all {streams} streams whole, every token exactly once"),
                   Check("storm_duplicates", "==", 0, "storm: no token twice")]
    if cells.cancel is not None:
        cancel = cells.cancel.figures
        for wire in ENGINE_WIRES:
            name = f"{wire}_cancel_latency_p99_ms"
            if name in cancel:
                figures[f"cancel_{name}"] = cancel[name]
                figures[f"cancel_{wire}_background_streams"] = cancel.get(
                    f"{wire}_background_streams")
                checks.append(Check(f"cancel_{name}", "<=", CANCEL_P99_MS,
                                    f"cancel p99 on the {wire} wire, ms, "
                                    f"{cancel.get(f'{wire}_background_streams')} running"))
    return figures, checks


TARGET_COLUMNS = ("target", "figure", "measured", "bound", "met")


def targets_report(cells: Cells, loadavg: tuple[float, float, float] = (0.0, 0.0, 0.0)
                   ) -> Report:
    """Every target of the cells that ran: one table, measured / target / met."""
    figures, checks = target_figures(cells)
    figures["loadavg_1m"] = round(loadavg[0], 2)
    results = judge(checks, figures)
    rows = tuple((r.check.why, r.check.figure, r.measured,
                  r.description.removeprefix(r.check.figure).strip(), r.holds)
                 for r in results)
    met = sum(r.holds for r in results)
    table = Table("targets", TARGET_COLUMNS, rows,
                  caption=f"{met} of {len(results)} targets met, load average "
                          f"{loadavg[0]:.1f} at the end")
    return Report("bench scale", "targets", story="the lab's own cost against its targets",
                  figures=figures, checks=results, tables=(table,))
