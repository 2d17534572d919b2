"""Resumable streams: generations that outlive the connection that watches them.

On the OpenAI route the request owns the engine call, so a disconnect cancels
it. On the resume surface (`/v1/streams`) the *registry* owns it (each
stream holds the call's lease, an `EngineLease` seen through resume/ports.py,
and closes it when the generation ends):

    POST /v1/streams ─▶ lease.open() ─▶ StreamRegistry.create()
                                           └─ producer task: engine call ─▶ ReplayLog
    GET .../events   ─▶ a follower: reads the log after Last-Event-ID, then waits
                        for more; attach/detach count the followers

- Each stream's producer task reads the gRPC call and appends to the stream's
  bounded ReplayLog whether or not anyone is listening.
- When the last follower detaches, a grace timer starts (`resume_grace_s`,
  or a shorter one the creator asked for). A follower attaching stops it. If it
  fires, the stream is cancelled: the gRPC call is cancelled (the engine stops
  at its next decode step, exactly as on the OpenAI route) and a terminal
  `cancelled` event goes into the log. Grace 0 cancels on the spot.
- A created stream that nobody ever GETs is cancelled after
  `resume_attach_timeout_s`.
- A finished stream (done, error or cancelled) stays replayable for its TTL,
  then is evicted; its id is remembered (a bounded set) so a late client gets
  410 Gone rather than 404.
- Memory: each log is bounded (events and bytes), and the sum over all logs is
  bounded too: over budget, the oldest finished streams are evicted first,
  then the growing stream drops its own oldest events (followers are told).
  A running stream always keeps its newest event, so the total can exceed the
  budget by at most one event per running stream (and those are capped).
- An engine call that drops (the hop blipped, or the engine died) under a
  detachable generation is attached again for up to `reattach_window_s`, its
  readers told `event: retry` (`engine_reattaching`, a Notice: not in the
  log) meanwhile; an engine that answers without the generation, or the
  window's end, ends the stream `error` (`generation_lost`) at once.
- The registry's `close()` (gateway shutdown) cancels every running stream.
- A stream belongs to the identity that created it; the routes answer any
  other identity 404, as for an id that never existed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from services.gateway.drain import DRAINING
from services.gateway.errors import EngineError, GatewayError
from services.gateway.openai_api import FINISH_REASONS, usage_dict
from services.gateway.resume.replay_log import Entry, ReplayLog, event_id
from services.gateway.resume.tasks import TaskFailures
from services.gateway.settings import GatewaySettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.generation import GenerationState

if TYPE_CHECKING:
    from services.gateway.resume.ports import Lease

log = logging.getLogger("streamlab.gateway")

MAX_ATTACH_RECORDS = 50  # per stream: enough to see a flapping client, bounded
# The engine's word (gRPC ABORTED) for "another caller attached to this
# detachable generation" (services/engine/detached.py, `Replaced`).
SUPERSEDED = "aborted"
MAX_TOMBSTONES = 10_000  # evicted ids remembered for a 410 instead of a 404
# An engine call that failed this way may have lost only its hop, not its
# generation (gRPC UNAVAILABLE: connection refused or reset; the idle
# deadline: a black-holed hop): a detachable one is attached again.
TRANSIENT_ENGINE_ERRORS = frozenset({"unavailable", "engine_idle_timeout"})
# The owner's re-attach after its engine call dropped is bounded by
# `settings.reattach_window_s`, a take-over's (redis_store.py) by
# `settings.takeover_window_s`; this is how often either tries again.
REATTACH_BACKOFF_S = 0.25
# What readers are told while the owner attaches again (`event: retry`, not
# in the log), and the terminal `error` code once the generation is lost.
ENGINE_REATTACHING = "engine_reattaching"
GENERATION_LOST = "generation_lost"


@dataclass(frozen=True)
class Notice:
    """Trouble that may pass, told to a stream's live readers as `event:
    retry` (no id, not in the log: a replay never repeats it) while it lasts;
    `number` tells a reader whether it has sent this one yet."""

    number: int
    code: str
    message: str


@dataclass(frozen=True)
class Attach:
    """One GET of the events URL, for the status endpoint and the tests."""

    at: float  # seconds since the stream was created
    last_event_id: str | None  # what the client sent (header or query)
    resumed_after: int  # the sequence number this connection continued after
    missed: tuple[int, int] | None  # what it asked for that was already dropped
    # The replica it attached to (the store stamps it) and this connection's
    # own id: a reader in the stream's record (services/gateway/resume/record.py).
    replica: str = ""
    reader: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


@dataclass(frozen=True)
class StreamPolicy:
    grace_s: float
    ttl_s: float
    retry_ms: int
    max_events: int  # this stream's replay log bound (events)
    # How long a stream nobody has attached to yet may run (None: the
    # gateway's `resume_attach_timeout_s`). A background response, which
    # runs whether or not anyone reads it, sets its own bound.
    attach_timeout_s: float | None = None


class ResumeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.streams = Counter("streamlab_gateway_resume_streams",
                               "Resumable streams by how they ended", ["outcome"],
                               registry=registry)
        self.connections = Counter("streamlab_gateway_resume_connections",
                                   "GETs of an events URL by replay kind", ["replay"],
                                   registry=registry)
        self.held = Gauge("streamlab_gateway_resume_streams_held",
                          "Streams held (running or replayable)", registry=registry)
        self.bytes = Gauge("streamlab_gateway_resume_replay_bytes",
                           "Bytes held in replay logs", registry=registry)
        self.reattached = Counter("streamlab_gateway_resume_engine_reattached",
                                  "Engine calls of resumable streams attached again after "
                                  "the engine hop dropped them", registry=registry)
        self.lost = Counter("streamlab_gateway_resume_generations_lost",
                            "Generations of resumable streams given up for lost after "
                            "their engine call dropped (the engine said it holds none, or "
                            "none answered within reattach_window_s)", registry=registry)
        self.tasks = TaskFailures(registry)  # services/gateway/resume/tasks.py


class ResumableStream:
    def __init__(self, stream_id: str, lease: Lease, log: ReplayLog,
                 policy: StreamPolicy, registry: StreamRegistry) -> None:
        self.id = stream_id
        # The identity that created it (services/gateway/identity.py): only it
        # may read, resume or stop the stream; anyone else gets 404.
        self.owner = lease.client_key
        self.log = log
        self.policy = policy
        self.state = GenerationState.RUNNING
        self.cancel_reason: str | None = None
        self.followers = 0
        self.attaches: list[Attach] = []
        self.readers: dict[str, Attach] = {}  # connected now, by reader id
        self.created = time.monotonic()
        self.ended_at: float | None = None
        self._lease = lease
        self._registry = registry
        self._changed = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        # The engine's index of the next token to come. A stream taken over
        # continues the shared log after its last event (a token's seq is its
        # index + 1): a re-attach before the first new token must ask for what
        # follows it, not for the whole answer again.
        self._next_index = log.last_seq
        self.notice: Notice | None = None  # while the owner re-attaches
        self._notices = 0

    @property
    def ended(self) -> bool:
        return self.state is not GenerationState.RUNNING

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    @property
    def changed(self) -> asyncio.Event:
        """Set at the next append or end. Take it *before* reading the log, so a
        change between the read and the wait cannot be missed."""
        return self._changed

    def start(self, attach_timeout_s: float) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._produce(), name=f"resumable-stream-{self.id}")
        self._registry.metrics.tasks.watch(self._task, "producer", self.id)
        self._arm(attach_timeout_s, "never_attached")

    # ---- followers ------------------------------------------------------------
    def attach(self, record: Attach) -> None:
        self.followers += 1
        self.attaches = [*self.attaches[-(MAX_ATTACH_RECORDS - 1):], record]
        self.readers[record.reader] = record
        self._disarm()

    def detach(self, record: Attach | None = None) -> None:
        self.followers -= 1
        if record is not None:
            self.readers.pop(record.reader, None)
        if self.followers == 0 and not self.ended:
            self._arm(self.policy.grace_s, "resume_grace_expired")

    def _arm(self, delay_s: float, reason: str) -> None:
        self._disarm()
        if delay_s <= 0:
            self.cancel(reason)
        else:
            self._timer = asyncio.get_running_loop().call_later(delay_s, self.cancel, reason)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ---- the generation ---------------------------------------------------------
    def cancel(self, reason: str) -> None:
        """Stop the generation at the engine and end the stream. Synchronous and
        idempotent: timers, DELETE and shutdown all land here."""
        if self.ended:
            return
        self.cancel_reason = reason
        self._lease.close()
        self._end(GenerationState.CANCELLED, "cancelled", {"reason": reason})
        if self._task is not None:
            self._task.cancel()

    async def _produce(self) -> None:
        try:
            while True:
                try:
                    async for event in self._lease.events():
                        if isinstance(event, pb.TokenChunk):
                            self._next_index = event.index + 1
                            self._append("token", {"index": event.index, "text": event.text})
                        elif isinstance(event, pb.Finish):  # tool calls: refused here
                            self._end(GenerationState.COMPLETED, "done", {
                                "finish_reason": FINISH_REASONS.get(event.reason, "stop"),
                                "usage": usage_dict(event.usage)})
                    return
                except EngineError as exc:
                    ended_with = await self._reattach(exc)
                    if ended_with is exc:
                        raise
                    if ended_with is not None:
                        raise ended_with from exc
        except EngineError as exc:
            if exc.code == DRAINING:  # the gateway's drain deadline cancelled the call
                self._drained()
            elif exc.code == SUPERSEDED:  # the engine: another caller attached to it
                self._superseded(exc)
            else:
                self._end(GenerationState.FAILED, "error", exc.body())
        except Exception as exc:
            if self.ended or self.handed_off:
                # After the fact (a re-attach that met the lease its stream's
                # end had closed): nothing is lost, nothing to tell.
                log.debug("stream %s: its producer stopped on %r after the end", self.id, exc)
            else:
                # Not the engine's answer (a bug on the way to the log): the
                # stream still ends, with an `error` its readers see, rather
                # than run on in nobody's hands with its readers waiting.
                self._registry.metrics.tasks.caught("producer", self.id, exc,
                                                    "the stream ends with an error")
                self._end(GenerationState.FAILED, "error", GatewayError(
                    500, "internal_error", "the gateway failed reading the generation").body())
        finally:
            self._lease.close()

    async def _reattach(self, exc: EngineError) -> EngineError | None:
        """The engine hop dropped the call (a blip: Toxiproxy off, a network
        flap; or the engine died), but a detachable generation outlives its
        call: the engine holds it as an orphan for its grace. Attach again
        after the last token the log has, every `REATTACH_BACKOFF_S`, its
        readers told `event: retry` (`engine_reattaching`) meanwhile; once
        attached, they get the rest, each token once. None: attached again.
        Else the error the stream ends with: `exc` itself when this is no
        blip (not detachable, the broken "terminal" mode, another failure),
        or `generation_lost` as soon as it is known lost: the engines that
        answered all said they hold no such generation (a 404: the engine
        restarted, or its grace ran out), or none answered for it within
        `reattach_window_s` (a dead engine is silent; each attempt is cut at
        the window's end, so the bound holds even across a black hole)."""
        settings = self._registry.settings
        if (exc.code not in TRANSIENT_ENGINE_ERRORS or not self._lease.detachable
                or settings.resume_transient != "retry"):
            return exc
        window_s = settings.reattach_window_s
        deadline = time.monotonic() + window_s
        after = self._next_index - 1 if self._next_index > 0 else None
        self._notify(ENGINE_REATTACHING,
                     f"the engine call dropped ({exc.code}); attaching to the generation "
                     f"again for up to {window_s:g} s")
        try:
            while (left := deadline - time.monotonic()) > 0:
                await asyncio.sleep(min(REATTACH_BACKOFF_S, left))
                try:
                    async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                        await self._lease.reattach(after)
                except TimeoutError:
                    break  # an attempt still waiting at the window's end
                except EngineError as again:
                    if (again.code in TRANSIENT_ENGINE_ERRORS
                            or again.status_code in (503, 504)):
                        continue  # nobody answered for it: the hop or its engine is down
                    if again.status_code == 404:
                        return self._lost(f"the engine no longer holds it ({again.message})")
                    log.warning("stream %s: re-attach after an engine-hop failure refused (%s)",
                                self.id, again.message)
                    return again
                self._registry.metrics.reattached.inc()
                return None
            return self._lost(f"no engine answered for it within {window_s:g} s of its call "
                              f"dropping ({exc.code})")
        finally:
            self._clear_notice()

    def _clear_notice(self) -> None:
        """The trouble is over (re-attached, or lost: the end follows)."""
        self.notice = None

    def _lost(self, why: str) -> EngineError:
        log.warning("stream %s: generation lost: %s", self.id, why)
        self._registry.metrics.lost.inc()
        return EngineError(502, GENERATION_LOST, f"generation lost: {why}")

    def _notify(self, code: str, message: str) -> None:
        """Tell the live readers (and any that attach while it lasts)."""
        self._notices += 1
        self.notice = Notice(self._notices, code, message)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _drained(self) -> None:
        """The drain's deadline dropped the engine call: this gateway's streams
        end here (the shared store hands them to another replica instead)."""
        self.cancel_reason = DRAINING
        self._end(GenerationState.CANCELLED, "cancelled", {"reason": DRAINING})

    def _superseded(self, exc: EngineError) -> None:
        """A newer caller attached to the generation and the engine ended this
        call. Only a replica of the shared store re-attaches (SharedStream
        steps aside); here it is an error like any other."""
        self._end(GenerationState.FAILED, "error", exc.body())

    @property
    def handed_off(self) -> bool:
        """Another replica continues it: this one's readers end with `retry:`."""
        return False

    def _append(self, kind: str, payload: dict[str, Any]) -> Entry:
        before = self.log.bytes
        entry = self.log.append(kind, json.dumps(payload, separators=(",", ":"),
                                                 ensure_ascii=False))
        self._registry.account(self, self.log.bytes - before)
        self._wake()
        return entry

    def _end(self, state: GenerationState, kind: str, payload: dict[str, Any]) -> None:
        if self.ended:
            return
        self._disarm()
        self.state = state
        self.ended_at = time.monotonic()
        self._append(kind, payload)  # the terminal event: it has an id like any other
        self._lease.close()  # the slot and the drain's tracking go with the generation
        self._registry.ended(self)

    def snapshot(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state.value,
            "cancel_reason": self.cancel_reason,
            "followers": self.followers,
            "first_seq": self.log.first_seq,
            "last_seq": self.log.last_seq,
            "last_event_id": event_id(self.id, self.log.last_seq),
            "replay_bytes": self.log.bytes,
            "grace_s": self.policy.grace_s,
            "ttl_s": self.policy.ttl_s,
            "attaches": [asdict(a) for a in self.attaches],
            "readers": [asdict(r) for r in sorted(self.readers.values(), key=lambda r: r.at)],
        }


StreamFactory = Callable[
    [str, "Lease", ReplayLog, StreamPolicy, "StreamRegistry"], ResumableStream]


class StreamRegistry:
    def __init__(self, settings: GatewaySettings, metrics: CollectorRegistry) -> None:
        self.settings = settings
        self.metrics = ResumeMetrics(metrics)
        self._streams: OrderedDict[str, ResumableStream] = OrderedDict()  # oldest first
        self._evictions: dict[str, asyncio.TimerHandle] = {}
        # Evicted id -> the identity that owned it: only that one is told 410;
        # to anyone else the id never existed (404), as for a live stream.
        self._tombstones: OrderedDict[str, str | None] = OrderedDict()
        self.total_bytes = 0

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    def get(self, stream_id: str) -> ResumableStream | None:
        return self._streams.get(stream_id)

    def was_evicted(self, stream_id: str, owner: str) -> bool:
        """Whether `owner`'s stream `stream_id` existed and was evicted."""
        if stream_id not in self._tombstones:
            return False
        return self._tombstones[stream_id] in (None, owner)

    def running(self) -> list[ResumableStream]:
        """The streams whose generation has not ended, oldest first."""
        return [s for s in self._streams.values() if not s.ended]

    def ensure_capacity(self) -> None:
        """Make room for one more stream, or refuse before the engine is asked."""
        while len(self._streams) >= self.settings.resume_max_streams:
            if not self._evict_oldest_finished():
                raise GatewayError(503, "resume_capacity",
                                   f"{len(self._streams)} resumable streams are running; "
                                   "try again later",
                                   headers={"Retry-After": str(self.settings.retry_after_s)})

    def create(self, stream_id: str, lease: Lease, policy: StreamPolicy,
               build: StreamFactory | None = None, after_seq: int = 0) -> ResumableStream:
        """Register a started generation and own its open lease from now on.
        `build`: a ResumableStream subclass's constructor (the shared store's
        mirrors its log to Redis); the plain one by default. `after_seq`: the
        sequence number its first event follows (a stream taken over from
        another replica continues the shared log)."""
        log = ReplayLog(policy.max_events, self.settings.resume_log_max_bytes, after_seq)
        stream = (build or ResumableStream)(stream_id, lease, log, policy, self)
        self._streams[stream_id] = stream
        self.metrics.held.set(len(self._streams))
        stream.start(self.settings.resume_attach_timeout_s if policy.attach_timeout_s is None
                     else policy.attach_timeout_s)
        return stream

    # ---- called by streams --------------------------------------------------------
    def account(self, stream: ResumableStream, delta: int) -> None:
        self.total_bytes += delta
        while self.total_bytes > self.settings.resume_total_max_bytes:
            if self._evict_oldest_finished(keep=stream):
                continue
            freed = stream.log.drop_oldest() if len(stream.log) > 1 else 0
            if freed == 0:
                break  # one event per running stream is the floor
            self.total_bytes -= freed
        self.metrics.bytes.set(self.total_bytes)

    def ended(self, stream: ResumableStream) -> None:
        outcome = stream.cancel_reason or stream.state.value
        self.metrics.streams.labels(outcome).inc()
        handle = asyncio.get_running_loop().call_later(
            stream.policy.ttl_s, self.evict, stream.id)
        self._evictions[stream.id] = handle

    # ---- eviction -------------------------------------------------------------------
    def evict(self, stream_id: str) -> None:
        stream = self._streams.pop(stream_id, None)
        handle = self._evictions.pop(stream_id, None)
        if handle is not None:
            handle.cancel()
        if stream is None:
            return
        self.total_bytes -= stream.log.clear()
        self._tombstones[stream_id] = stream.owner
        while len(self._tombstones) > MAX_TOMBSTONES:
            self._tombstones.popitem(last=False)
        self.metrics.held.set(len(self._streams))
        self.metrics.bytes.set(self.total_bytes)

    def _evict_oldest_finished(self, keep: ResumableStream | None = None) -> bool:
        for stream_id, stream in self._streams.items():
            if stream.ended and stream.followers == 0 and stream is not keep:
                self.evict(stream_id)
                return True
        return False

    async def close(self) -> None:
        """Gateway shutdown: cancel what runs (the engine stops), drop the rest."""
        for stream in list(self._streams.values()):
            stream.cancel("gateway_shutdown")
        tasks = [s.task for s in self._streams.values() if s.task is not None]
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        for stream_id in list(self._streams):
            self.evict(stream_id)
