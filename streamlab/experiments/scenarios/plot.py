"""A scenario's token arrivals, broken above fixed, on one time axis.

    ArrivalClock      what a measure holds while it reads: a tick per token and a
                      mark per fault event (cut, restore, the client's leave,
                      the engine's cancel, an error), in seconds since the
                      request; `.timeline()` hands them to the runner
    from_token_times  the same for a client that timed its tokens itself
    Arrivals          the same, read back: tokens and events
    arrivals_of(r)    a scenario run's Arrivals, from its "arrivals" timeline file
    lanes(report)     (mode, Arrivals) of every run of one scenario in a plan's report
    draw(name, lanes, path)   the PNG: one row per mode, a tick per token,
                      a vertical line per event (matplotlib, the `plot` extra)

The arrivals travel as a Timeline (model.py): the runner writes it beside the
other timelines and lists the file among the report's artifacts, so the
report's JSON holds a path, not a few hundred floats per run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from streamlab.experiments.report import JSON, Report
from streamlab.experiments.scenarios.model import Timeline

ARRIVALS = "arrivals"  # the timeline's name: "<scenario>-<mode>-arrivals.json"
# Event kinds and how they are drawn; an unknown kind draws grey.
EVENT_COLOURS = {"cut": "#d62728", "restore": "#2ca02c", "leave": "#8c564b",
                 "cancel": "#ff7f0e", "error": "#9467bd", "timeout": "#9467bd",
                 "done": "#333333"}
PING = "ping"  # a `: ping` heartbeat: drawn as a short tick, not a line
# Marks that often fall together (a cut and its restore, a leave and its cancel)
# stay apart by their dashes.
EVENT_STYLES = {"restore": ":", "cancel": "-.", "done": ":"}


@dataclass(frozen=True)
class Arrivals:
    tokens: tuple[float, ...] = ()  # seconds since the request, one per token received
    events: tuple[tuple[float, str], ...] = ()  # (seconds, kind): cut, restore, ping, ...

    def timeline(self) -> Timeline:
        data: dict[str, JSON] = {
            "tokens": [round(t, 4) for t in self.tokens],
            "events": [{"at_s": round(at, 4), "kind": kind} for at, kind in self.events],
        }
        return Timeline(ARRIVALS, "token arrivals and fault events", data)

    @classmethod
    def from_json(cls, data: JSON) -> Arrivals:
        """The timeline's data read back; anything not of its shape raises ValueError."""
        if not isinstance(data, dict):
            raise ValueError("arrivals: not an object")
        tokens, events = data.get("tokens", []), data.get("events", [])
        if not isinstance(tokens, list) or not isinstance(events, list):
            raise ValueError("arrivals: tokens and events must be lists")
        marks = []
        for event in events:
            if not isinstance(event, dict):
                raise ValueError("arrivals: an event is not an object")
            at, kind = event.get("at_s"), event.get("kind")
            if not isinstance(at, int | float) or not isinstance(kind, str):
                raise ValueError(f"arrivals: bad event {event!r}")
            marks.append((float(at), kind))
        return cls(tuple(_seconds(t) for t in tokens), tuple(marks))


def _seconds(value: JSON) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"arrivals: {value!r} is not a time")
    return float(value)


@dataclass
class ArrivalClock:
    """Started when the request is sent; every tick and mark is seconds since then
    on the client's clock (perf_counter), the clock the figures are measured on."""

    started: float = field(default_factory=time.perf_counter)
    tokens: list[float] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)

    def now(self) -> float:
        return time.perf_counter() - self.started

    def token(self, *_: object) -> None:
        """A token arrived (the arguments are ignored, so it can be any client's
        on_token callback)."""
        self.tokens.append(self.now())

    def event(self, kind: str, *, ago_s: float = 0.0) -> None:
        """A fault event, now or `ago_s` seconds before now (a reconnection
        learns of the cut after the client's retry wait)."""
        self.events.append((max(0.0, self.now() - ago_s), kind))

    def arrivals(self) -> Arrivals:
        return Arrivals(tuple(self.tokens), tuple(sorted(self.events)))

    def timeline(self) -> Timeline:
        return self.arrivals().timeline()


def from_token_times(token_times: Iterable[float],
                     events: Iterable[tuple[float | None, str]] = ()) -> Timeline:
    """The arrivals timeline of a client that already timed its tokens from the
    request (services/client/openai_stream.py's token_times), with events (at,
    kind) on the same clock; one whose time is None did not happen."""
    marks = tuple(sorted((at, kind) for at, kind in events if at is not None))
    return Arrivals(tuple(token_times), marks).timeline()


def arrivals_of(report: Report) -> Arrivals | None:
    """The arrivals one run recorded (None: its measure records none)."""
    for artifact in report.artifacts:
        if artifact.kind == "timeline" and artifact.path.endswith(f"-{ARRIVALS}.json"):
            return Arrivals.from_json(json.loads(Path(artifact.path).read_text()))
    return None


def _runs(report: Report) -> Iterable[Report]:
    if not report.parts:
        yield report
    for part in report.parts:
        yield from _runs(part)


def lanes(report: Report, scenario: str) -> list[tuple[str, Arrivals]]:
    """(mode, arrivals) for each mode of `scenario` that ran and recorded
    arrivals, broken before fixed; with repeats, each mode's last run."""
    latest: dict[str, Arrivals] = {}
    for run in _runs(report):
        if run.experiment != scenario or run.status != "ran":
            continue
        found = arrivals_of(run)
        if found is not None:
            latest[run.variant] = found
    return [(mode, latest[mode]) for mode in ("broken", "fixed") if mode in latest]


def draw(scenario: str, rows: Sequence[tuple[str, Arrivals]], path: Path, *,
         title: str = "") -> Path:
    """One row per (mode, arrivals), sharing the time axis: a tick per token, a
    vertical line per event, labelled once in the legend. matplotlib is imported
    here: it is the `plot` extra, and slow to load."""
    if not rows:
        raise ValueError(f"{scenario}: no run recorded token arrivals to plot")
    import matplotlib

    matplotlib.use("Agg")  # headless: scenarios run in terminals and CI
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), 1, sharex=True, squeeze=False,
                             figsize=(9, 1.1 + 1.3 * len(rows)))
    end = max([*(t for _, a in rows for t in a.tokens), *(at for _, a in rows
                                                         for at, _ in a.events), 0.1])
    labelled: set[str] = set()
    for ax, (mode, arrivals) in zip(axes[:, 0], rows, strict=True):
        ax.eventplot([list(arrivals.tokens)], colors="#1f77b4", lineoffsets=0.5,
                     linelengths=0.8, linewidths=1.2)
        pings = [at for at, kind in arrivals.events if kind == PING]
        if pings:  # short grey ticks under the tokens: a heartbeat is no fault
            ax.eventplot([pings], colors="#999999", lineoffsets=0.06, linelengths=0.1,
                         linewidths=1.0, label="ping")
            labelled.add(PING)
        for at, kind in arrivals.events:
            if kind == PING:
                continue
            label = None if kind in labelled else kind
            labelled.add(kind)
            ax.axvline(at, color=EVENT_COLOURS.get(kind, "#777777"),
                       linestyle=EVENT_STYLES.get(kind, "--"), linewidth=1.8, label=label)
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.set_ylabel(f"{mode}\n{len(arrivals.tokens)} tokens", rotation=0, ha="right",
                      va="center", fontsize=9)
        ax.set_xlim(0, end * 1.05)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the request")
    fig.suptitle(title or f"{scenario}: token arrivals", fontsize=10)
    if labelled:
        fig.legend(loc="upper right", fontsize=8, ncols=len(labelled), frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
