"""What a scenario is: data. A name, a setup per mode, what to measure, and
what "broken" and "fixed" look like as checks on the measured figures.

    Scenario
      ├── measure        async (lab, setup, timing) -> Figures | Measured
      ├── broken: Variant(setup, expect=[Check, ...], story)
      ├── fixed:  Variant(setup, expect=[Check, ...], story)
      └── client         ClientSettings: how its own client drives the stream

A check names a figure, a comparison and a bound; a bound may be a function
of the (scaled) timing, so "TTFT ≤ prefill + 2 gaps + tolerance" stays true
when the time constants change. Adding a scenario is one
`register(Scenario(...))` (registry.py) beside its measure: in catalogue.py when
the measure is one of measures.py's, else in the family module that holds it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from streamlab.errors import StreamlabError
from streamlab.experiments.report import JSON, Check, Figure, Figures
from streamlab.experiments.timing import Timing
from streamlab.lab.target import Capability
from streamlab.lab.toxiproxy import Toxic

if TYPE_CHECKING:
    from streamlab.lab.target import LabTarget

Mode = Literal["broken", "fixed"]
MODES: tuple[Mode, ...] = ("broken", "fixed")


@dataclass(frozen=True)
class Setup:
    """Everything a mode changes. Per-request knobs and nginx locations only:
    no service restarts, so a scenario runs against any lab that is up."""

    toxics: tuple[tuple[str, Toxic], ...] = ()  # (hop, toxic)
    location: str = "/"  # nginx location (see proxies/nginx/nginx.conf.template)
    accept_encoding: str = "identity"  # "gzip" to let nginx compress
    heartbeat: Literal["gateway", "off", "on"] = "gateway"  # on = Timing.heartbeat_s
    think_pause: bool = False  # pause Timing.think_s after token THINK_AFTER_TOKEN
    # Client read timeout = Timing.watchdog_s; without it the client has none at all.
    watchdog: bool = False
    # When the harness gives up on the client and calls it hung: "long" is far past
    # any plausible end; "short" is three watchdog periods past the expected end,
    # which is proof enough that a client without a watchdog would wait forever.
    patience: Literal["long", "short"] = "long"
    # Settings only one measure function understands (e.g. when to close the
    # client), so a new scenario family needs no new field here.
    knobs: Mapping[str, Figure] = field(default_factory=dict)
    parser: Literal["sse", "naive"] = "sse"  # naive: one event per read (the classic bug)
    read_pause_s: float = 0.0  # a slow consumer: pause between reads

    def as_json(self) -> dict[str, JSON]:
        fields: dict[str, JSON] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        knobs: dict[str, JSON] = dict(self.knobs)
        toxics: list[JSON] = [{"hop": hop, **toxic.as_json()} for hop, toxic in self.toxics]
        return {**fields, "knobs": knobs, "toxics": toxics}


THINK_AFTER_TOKEN = 2


class ScenarioUnavailable(StreamlabError, RuntimeError):
    """This lab or machine cannot run the scenario (no chromium, no HTTP/2 edge):
    raised by a measure before it measures anything; the tests skip with its reason."""


@dataclass(frozen=True)
class Variant:
    setup: Setup
    expect: tuple[Check, ...]
    story: str

    def as_json(self, timing: Timing) -> dict[str, JSON]:
        expect: list[JSON] = [check.as_json(timing) for check in self.expect]
        return {"story": self.story, "setup": self.setup.as_json(), "expect": expect}


@dataclass(frozen=True)
class Timeline:
    """A series a measure recorded beside its figures (e.g. every connection
    attempt of a reconnect storm): the runner writes it to a file and lists it
    among the report's artifacts."""

    name: str  # part of the file name: "<scenario>-<mode>-<name>.json"
    title: str
    data: JSON


@dataclass(frozen=True)
class Measured:
    """What a measure returns when it has more than figures to give."""

    figures: Figures
    timelines: tuple[Timeline, ...] = ()


# The request ids of the streams the running measure opened (the runner sets
# it around each measure; tasks the measure starts share the list).
_noted_streams: ContextVar[list[str] | None] = ContextVar("streamlab_noted_streams",
                                                           default=None)


def note_stream(request_id: str) -> None:
    """A measure names a stream it opened through the lab (its X-Request-Id):
    the run's report and `scenario show NAME --last` list it, and `streamlab
    trace ID` opens it on a lab up with --tracing. Outside a run: nothing."""
    noted = _noted_streams.get()
    if noted is not None and request_id and request_id not in noted:
        noted.append(request_id)


@contextlib.contextmanager
def noting_streams() -> Iterator[list[str]]:
    """The request ids note_stream hears while the block runs, in order."""
    noted: list[str] = []
    token = _noted_streams.set(noted)
    try:
        yield noted
    finally:
        _noted_streams.reset(token)


Measure = Callable[["LabTarget", Setup, Timing], Awaitable[Figures | Measured]]


@dataclass(frozen=True)
class ClientSettings:
    """How the scenario's own client drives its stream where that departs from
    the timing, declared with the scenario so whoever replays it (the console's
    presets) copies the measure instead of reaching into its module. None: as
    the timing says."""

    answer_tokens: int | Callable[[Timing], int] | None = None
    prefill_ms: int | None = None
    silent_prefill: bool = False  # no `: ping` either: nothing is written before the first token
    leave_after_tokens: int | None = None  # the client walks away (0: during the prefill)
    fault_after_tokens: int | None = None  # a mid-stream fault lands after this many tokens

    def tokens(self, timing: Timing) -> int | None:
        return self.answer_tokens(timing) if callable(self.answer_tokens) else self.answer_tokens


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    measure: Measure
    broken: Variant
    fixed: Variant
    shown: tuple[str, ...] = field(default=())  # figures to show first, in this order
    client: ClientSettings = field(default_factory=ClientSettings)
    # What of the target the scenario uses beyond what every target has: its
    # measure reads the engine's record, the services' logs, toggles hops. A
    # scenario that starts a private lab of its own needs nothing of the
    # target's replicas or restarts (its private lab has them).
    needs: frozenset[Capability] = frozenset()

    def variant(self, mode: Mode) -> Variant:
        return self.broken if mode == "broken" else self.fixed

    def as_json(self, timing: Timing) -> dict[str, JSON]:
        """What the catalogue holds for this scenario (`streamlab scenario list --json`)."""
        shown: list[JSON] = list(self.shown)
        needs: list[JSON] = [str(capability) for capability in sorted(self.needs)]
        modes: dict[str, JSON] = {mode: self.variant(mode).as_json(timing) for mode in MODES}
        return {"name": self.name, "summary": self.summary, "measure": self.measure.__name__,
                "shown": shown, "needs": needs, "modes": modes}
