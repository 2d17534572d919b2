"""The shared resume store (`resume_store = "redis"`): every replica serves
every stream; the replica that created a stream owns its engine call.

    owner (created it)                      any other replica
    ──────────────────                      ─────────────────
    SharedStream: the memory stream,        find / status: HGETALL meta
      readers served from memory              (services/gateway/resume/redis_tail.py)
      LogMirror ─▶ Redis (batched)  ──────▶ tail: XREAD after Last-Event-ID,
      grace timer counts remote readers       BLOCK for the live tail; its
        (ZCOUNT followers)          ◀──────     presence in `followers`
      ControlChannel: cancel        ◀──────  DELETE: PUBLISH to the owner's
                                               channel, wait for the end

Key layout: services/gateway/resume/redis_keys.py. Who cancels: a DELETE anywhere
lands in the owner's `ResumableStream.cancel`; the grace timer runs on the
owner only, and when it fires it cancels only if no reader on any replica is
present (else it looks again every third of the follower TTL, and once the
last remote reader is gone gives the full grace from then).

A lost owner (ARCHITECTURE.md draws who owns a generation across replicas): its
generations are detachable, so the engine keeps them running for its orphan
grace. A reader on another replica that finds the owner's alive key gone (it
was SIGKILLed), or the meta's `replica` empty (it drained and handed its
streams off), claims the stream in one Lua script (one winner), re-attaches
to the engine's generation after the last token the shared log holds, and
owns it from then on: its LogMirror continues the log, its control channel
takes DELETEs, its grace timer runs. With `reattach` off (the broken case),
or when the engine no longer holds it, the stream ends `owner_lost`.

Redis faults: creating a stream needs Redis (its metadata is written before
the 201; else 503 and the generation is cancelled); a running stream's owner
needs it for nothing its own readers see (writes retry, services/gateway/
redis_log.py says what is lost); every other replica answers 503 (or ends a
tail with an SSE `error`) within `redis_timeout_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from sse_starlette import ServerSentEvent

from services.gateway.errors import EngineError
from services.gateway.resume.memory import MemoryStore, expired, find_local, follow_local, unknown
from services.gateway.resume.record import RecordWriter, read_record
from services.gateway.resume.redis_client import CancelSafeRedis, StockTransportRedis
from services.gateway.resume.redis_control import POLL_S as CONTROL_POLL_S
from services.gateway.resume.redis_control import ControlChannel
from services.gateway.resume.redis_keys import (
    ALIVE_TTL_S,
    RELEASED,
    StreamKeys,
    StreamMeta,
    owned_key,
    replica_key,
    replicas_key,
    stream_keys,
)
from services.gateway.resume.redis_log import RETRY_MAX_S, STORE_ERRORS, LogMirror, StoreMetrics
from services.gateway.resume.redis_tail import (
    Presence,
    ReaderMustMove,
    first_seq,
    fresh_followers,
    read_meta,
    store_unavailable,
    tail,
)
from services.gateway.resume.replay_log import Entry, ReplayLog, event_id, is_stream_id
from services.gateway.resume.store import FoundStream, ResumeStore
from services.gateway.resume.streams import (
    REATTACH_BACKOFF_S,
    Attach,
    ResumableStream,
    StreamPolicy,
    StreamRegistry,
)
from services.gateway.settings import GatewaySettings
from streamlab_protocol.generation import GenerationState

if TYPE_CHECKING:
    from services.gateway.resume.ports import Gateway, Lease

log = logging.getLogger("streamlab.gateway")

KEY_PREFIX = "streamlab:resume"
# Ends a stream whose owner is gone, atomically, if it is still running:
# KEYS events, meta; ARGV terminal data, reason, max_events, and the newest
# sequence number the reader that noticed has (its client may hold events the
# dead owner served from memory and never wrote: the end must come after them).
END_ORPHAN = """
if redis.call('HGET', KEYS[2], 'state') ~= 'running' then return 0 end
local seq = math.max(tonumber(redis.call('HGET', KEYS[2], 'last_seq')), tonumber(ARGV[4])) + 1
redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[3], '0-' .. seq, 'k', 'cancelled', 'd', ARGV[1])
redis.call('HSET', KEYS[2], 'state', 'cancelled', 'cancel_reason', ARGV[2], 'last_seq', seq)
return seq
"""
# Takes a running stream over from a replica that is gone, atomically: among
# the replicas whose readers noticed at once, one wins (the others see the
# meta's `replica` changed). KEYS meta, the old owner's alive key; ARGV old
# replica (RELEASED when it handed the stream off), this replica, the old
# owner's incarnation ("" if unknown), this one's. Returns the
# last sequence number the log holds, or -1 when there is nothing to take.
# (Two keys of different hash slots: fine on one Redis, not on a Cluster.)
CLAIM = """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return -1 end
if redis.call('HGET', KEYS[1], 'replica') ~= ARGV[1] then return -1 end
local alive = redis.call('GET', KEYS[2])
if ARGV[1] ~= '' and alive and (ARGV[3] == '' or alive == ARGV[3]) then return -1 end
redis.call('HSET', KEYS[1], 'replica', ARGV[2], 'incarnation', ARGV[4])
return tonumber(redis.call('HGET', KEYS[1], 'last_seq'))
"""
# How long after a store failure a reader's record is not waited for (it
# would wait the whole Redis bound again, on every resume while it is down).
RECORD_SKIP_AFTER_FAILURE_S = 5.0
# How long after this replica's own last store failure a missing alive key is
# not taken as a dead owner: the key's TTL (it may have expired during the
# outage), plus the owner's control loop getting back (its reconnect backoff
# and one poll) to refresh it.
OWNER_SILENCE_AFTER_OUTAGE_S = ALIVE_TTL_S + RETRY_MAX_S + CONTROL_POLL_S
# How often a replica looks for lost owners (RedisStore._sweep), and how many
# of a lost owner's streams it takes over at once.
SWEEP_S = 1.0
TAKEOVER_CONCURRENCY = 64
# One sweep step's bound: far above a store call's (REDIS_TIMEOUT_S), since
# the sweep is background work nobody waits on, and on a loaded machine the
# event loop of a gateway serving a storm lags by seconds: 1 s bounds fired
# with the store healthy, sweep after sweep, while the orphans' grace ran out.
SWEEP_TIMEOUT_S = 10.0
# The engine's refusal of an index older than its buffer names the oldest it holds.
OLDEST_HELD = re.compile(r"the oldest held is (\d+)")
# A retried reader's attempt is written within this many store timeouts (a new
# connection's handshake and the script's round trips, on a slow store).
ATTEMPT_WRITE_BOUND = 10
# A stream this replica claimed but could not run is ended `owner_lost` in the
# log; a store error on that write is tried again for this long (nobody else
# will end it: every replica sees its owner, this one, alive), then the meta's
# running TTL is left to end it.
CLAIMED_END_RETRY_S = 30.0


class SharedStream(ResumableStream):
    """A stream this replica owns: its log is mirrored to Redis, and its grace
    timer asks Redis whether anyone elsewhere is reading."""

    def __init__(self, stream_id: str, lease: Lease, log: ReplayLog,
                 policy: StreamPolicy, registry: StreamRegistry, store: RedisStore) -> None:
        super().__init__(stream_id, lease, log, policy, registry)
        self._store = store
        self._epoch = 0  # bumped by every arm/disarm: a stale check must not cancel
        self._check_task: asyncio.Task[None] | None = None  # held: the loop keeps weak refs
        self.created_unix = time.time()
        # The stream's trace, kept in its meta for whoever takes it over.
        self.traceparent = lease.trace_headers().get("traceresponse", "")
        self._handed_off = False
        self._store_doubted = False  # a grace was given for a store that failed
        self.keys = stream_keys(KEY_PREFIX, stream_id)
        self.mirror = LogMirror(
            store.redis, self.keys, self.meta,
            running_ttl_s=store.settings.max_stream_duration_s + policy.ttl_s,
            pending_max=store.settings.redis_pending_max_events, metrics=store.store_metrics,
            survive_any=store.settings.resume_store_errors == "any")

    def meta(self) -> StreamMeta:
        replica = RELEASED if self._handed_off else self._store.settings.replica_id
        return StreamMeta(owner=self.owner, replica=replica,
                          state=self.state, cancel_reason=self.cancel_reason,
                          last_seq=self.log.last_seq, grace_s=self.policy.grace_s,
                          ttl_s=self.policy.ttl_s, retry_ms=self.policy.retry_ms,
                          max_events=self.policy.max_events, created=self.created_unix,
                          incarnation="" if self._handed_off else self._store.control.incarnation,
                          notice=json.dumps({"n": self.notice.number, "code": self.notice.code,
                                             "message": self.notice.message})
                          if self.notice is not None else "",
                          traceparent=self.traceparent)

    def _notify(self, code: str, message: str) -> None:
        """The owner's readers are told from memory; readers on other replicas
        read the notice from the meta, written now (no event comes with it)."""
        super()._notify(code, message)
        self.mirror.touch()

    def _clear_notice(self) -> None:
        """Cleared in the meta too, at once: a reader that comes to another
        replica meanwhile must not be told of trouble that is over."""
        super()._clear_notice()
        self.mirror.touch()

    def _append(self, kind: str, payload: dict[str, Any]) -> Entry:
        entry = super()._append(kind, payload)
        self.mirror.add(entry)
        return entry

    # ---- a drain hands the stream to another replica -----------------------------
    @property
    def handed_off(self) -> bool:
        return self._handed_off

    def _drained(self) -> None:
        """The drain dropped the engine call, which only orphans a detachable
        generation: instead of ending the stream, write what is pending and
        mark it released (meta `replica` empty), so the replica its client
        reconnects to takes it over at once (no wait for an alive key to
        expire), and end this replica's readers with `retry:`."""
        if not self._store.settings.reattach:
            super()._drained()
            return
        self.mirror.release()
        self._step_aside("handed_off")

    def hand_off_at_exit(self) -> None:
        """This replica exits with the stream still running here (its drain
        off, skipped by a second SIGTERM, or too short for a loaded loop to
        hand everything off): release it as the drain does, so the replica
        its client reconnects to takes it over, instead of cancelling it. An
        exit must lose no more than a crash would (a SIGKILLed owner's streams
        are taken over). The call is dropped with the process, never
        cancelled: the engine keeps the detachable generation for its orphan
        grace."""
        if self.ended or self._handed_off or not self._store.settings.reattach:
            return
        self._drained()  # released, as the drain's deadline does it
        if self._task is not None:
            self._task.cancel()

    def _superseded(self, exc: EngineError) -> None:
        """Another replica took the stream over and attached to the generation
        while this one still read it (this one's alive key expired while it
        could not reach the store). That replica owns the log now: step aside
        without a word in it (no terminal event, no metadata: what this one
        still had pending the new owner re-read from the engine), and end this
        replica's readers with `retry:`, so they reconnect and read the log the
        new owner writes."""
        if not self._store.settings.reattach:
            super()._superseded(exc)
            return
        log.warning("stream %s: another replica attached to its generation; stepping aside",
                    self.id)
        self.mirror.abandon()
        self._step_aside("superseded")

    def _end(self, state: GenerationState, kind: str, payload: dict[str, Any]) -> None:
        ended = self.ended
        super()._end(state, kind, payload)
        if not ended:
            self._store.disown(self.id)

    def _step_aside(self, outcome: str) -> None:
        """This replica no longer runs the stream (its log writer was told how
        to stop): no explicit Cancel, since the generation is, or will be,
        another replica's; and its readers end with `retry:`."""
        self._store.disown(self.id)
        self._handed_off = True
        self._disarm()
        self._lease.abandon_call()
        self._lease.close()
        self._store.store_metrics.takeovers.labels(outcome).inc()
        self._changed.set()
        self._changed = asyncio.Event()

    def cancel(self, reason: str) -> None:
        if not self._handed_off:  # else it is another replica's to stop
            super().cancel(reason)

    # ---- grace that counts readers on every replica ------------------------------
    def _arm(self, delay_s: float, reason: str) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(
            max(delay_s, 0.0), self._expire, reason, self._epoch, False)

    def _disarm(self) -> None:
        self._epoch += 1
        super()._disarm()

    def remote_attached(self) -> None:
        """A reader on another replica: what was a never-attached timer
        becomes a watch on the remote readers (then the grace once they leave)."""
        if self.ended or self.followers > 0:
            return
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(
            self._store.settings.redis_follower_ttl_s / 3, self._expire,
            "resume_grace_expired", self._epoch, True)

    def remote_left(self) -> None:
        """A reader on another replica left: count the readers now rather than
        at the next poll (a third of the follower TTL later), so a short grace
        (0: cancel when the client leaves) holds for a reader elsewhere too."""
        if self.ended or self.followers > 0 or self._timer is None:
            return  # ended, read here, or no watch running (a check is under way)
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(
            0, self._expire, "resume_grace_expired", self._epoch, True)

    def _expire(self, reason: str, epoch: int, remote_seen: bool) -> None:
        self._timer = None
        self._check_task = asyncio.get_running_loop().create_task(
            self._check(reason, epoch, remote_seen), name=f"resume-grace-{self.id}")

    async def _check(self, reason: str, epoch: int, remote_seen: bool) -> None:
        try:
            await self._check_once(reason, epoch, remote_seen)
        except Exception as exc:
            # A check that died left the stream with no timer at all: never
            # cancelled for want of readers, whatever came after. Look again
            # in a while, as for a reader elsewhere.
            poll_s = self._store.settings.redis_follower_ttl_s / 3
            self._store.store_metrics.tasks.caught("grace_check", self.id, exc,
                                                   f"checked again in {poll_s:.1f} s")
            if epoch == self._epoch and not self.ended and self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(
                    poll_s, self._expire, reason, epoch, remote_seen)

    async def _check_once(self, reason: str, epoch: int, remote_seen: bool) -> None:
        try:
            remote = await fresh_followers(self._store.redis, self.keys)
            if not remote and not remote_seen and reason == "never_attached":
                # Read on another replica whose "attached" never arrived (that
                # replica was killed before it sent it, in a storm): its attach
                # record is in the store. A reader came, so the grace applies.
                remote_seen = bool(await self._store.redis.llen(self.keys.attaches))
                if remote_seen:
                    reason = "resume_grace_expired"
                    self._timer = asyncio.get_running_loop().call_later(
                        self.policy.grace_s, self._expire, reason, epoch, False)
                    return
        except STORE_ERRORS:
            remote = 0  # no store: nobody elsewhere can be reading it
            self._store.store_metrics.store_failed()
        if epoch != self._epoch or self.ended or self.followers > 0:
            return  # a local reader came back meanwhile, or it ended
        loop = asyncio.get_running_loop()
        if remote:  # someone elsewhere reads: look again soon
            self._store_doubted = False
            poll_s = self._store.settings.redis_follower_ttl_s / 3
            self._timer = loop.call_later(poll_s, self._expire, "resume_grace_expired",
                                          epoch, True)
        elif remote_seen:  # the last remote reader just left: its grace starts now
            self._timer = loop.call_later(self.policy.grace_s, self._expire,
                                          "resume_grace_expired", epoch, False)
        elif self._store_in_doubt():
            # "Nobody reads elsewhere" read from a store that failed since the
            # stream began (a timeout on a loaded machine, a blip) is no proof:
            # a reader on another replica could not register while it failed.
            # Decide after one more grace. It cancelled streams `never_attached`
            # whose reader came to another replica during a store outage.
            self._store_doubted = True
            self._timer = loop.call_later(self.policy.grace_s, self._expire, reason, epoch,
                                          False)
        else:
            self.cancel(reason)

    def _store_in_doubt(self) -> bool:
        """The store failed since this stream began, and no grace was given for
        it yet (once: a store that stays down must not keep a generation
        running for nobody)."""
        since = max(time.time() - self.created_unix, 0.0)
        return not self._store_doubted and self._store.store_metrics.store_failed_within(since)


class RedisStore(ResumeStore):
    def __init__(self, settings: GatewaySettings, metrics: CollectorRegistry) -> None:
        self.settings = settings
        timeout = settings.redis_timeout_s
        # One bound for every call (connect and reply); a live tail's blocking
        # read has its own client, whose bound adds the time it blocks.
        self.block_s = min(timeout, settings.redis_follower_ttl_s) / 3
        common: dict[str, Any] = {"socket_connect_timeout": timeout, "decode_responses": True,
                                  "retry_on_timeout": False, "health_check_interval": 5}
        # Cancel-safe: redis-py's sends lose a cancel on Python 3.11, and a
        # reader's body would stream on after its client left (redis_client.py).
        client = (CancelSafeRedis if settings.resume_store_errors == "any"
                  else StockTransportRedis)
        self.redis = client.from_url(settings.redis_url, socket_timeout=timeout, **common)
        self.tail_redis = client.from_url(settings.redis_url,
                                          socket_timeout=timeout + self.block_s, **common)
        # Writes no request waits for, which may take longer than a request's
        # bound: a retried reader's attempt (`attempted`).
        self.patient_redis = client.from_url(
            settings.redis_url, socket_timeout=ATTEMPT_WRITE_BOUND * timeout, **common)
        self.memory = MemoryStore(settings, metrics, build=self._build)
        self.metrics = self.memory.metrics
        self.store_metrics = StoreMetrics(metrics, self.metrics.tasks)
        self.control = ControlChannel(self.redis, KEY_PREFIX, settings.replica_id,
                                      self._on_command, self.store_metrics.heartbeat_failed,
                                      self.store_metrics.tasks)
        # replica -> (when asked, its alive key's value): every quiet reader of
        # a lost owner's streams asks the same question each poll; one answer
        # per poll interval serves them all (hundreds of GETs a second fewer).
        self._alive_seen: dict[str, tuple[float, str | None]] = {}
        self._mirrors: set[LogMirror] = set()
        self._end_orphan = self.redis.register_script(END_ORPHAN)
        self._claim = self.redis.register_script(CLAIM)
        # The stream's record (attaches, readers), shared: services/gateway/resume/record.py.
        self.record = RecordWriter(
            self.redis, settings.redis_follower_ttl_s, settings.redis_timeout_s,
            fallback_ttl_s=settings.max_stream_duration_s + settings.resume_ttl_s,
            failures=self.store_metrics.tasks, patient=self.patient_redis)
        self._prewritten: set[str] = set()  # readers `attached` wrote, until `follow`
        self._gateway: Gateway | None = None  # set by open(): leases for a takeover
        self._sweeper: asyncio.Task[None] | None = None
        self._sweeping: set[str] = set()  # lost replicas whose streams the sweep takes over
        # Streams claimed here whose adoption runs now (RedisStore._run_claimed).
        self._adopting: dict[str, asyncio.Task[None]] = {}
        self._disowning: set[asyncio.Task[None]] = set()  # held: the loop keeps weak refs
        self._owned_key = owned_key(KEY_PREFIX, settings.replica_id)
        self._owned_ttl_ms = int((settings.max_stream_duration_s + settings.resume_ttl_s) * 1000)

    @property
    def detachable_generations(self) -> bool:  # type: ignore[override]
        return self.settings.reattach

    def _build(self, stream_id: str, lease: Lease, log: ReplayLog, policy: StreamPolicy,
               registry: StreamRegistry) -> ResumableStream:
        return SharedStream(stream_id, lease, log, policy, registry, self)

    async def open(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self.control.start()
        self.record.start()
        self._sweeper = asyncio.get_running_loop().create_task(
            self._sweep_forever(), name="resume-takeover-sweep")

    def ensure_capacity(self) -> None:
        self.memory.ensure_capacity()

    def local(self, stream_id: str) -> ResumableStream | None:
        """The stream if this replica runs its engine call (not once handed off)."""
        stream = self.memory.local(stream_id)
        return None if stream is None or stream.handed_off else stream

    async def create(self, stream_id: str, lease: Lease, policy: StreamPolicy
                     ) -> StreamPolicy:
        stream = self.memory.registry.create(stream_id, lease, policy, self._build)
        assert isinstance(stream, SharedStream)
        try:
            await stream.mirror.write_meta()
        except STORE_ERRORS as exc:
            self.store_metrics.write_failures.inc()
            stream.cancel("resume_store_unavailable")
            raise store_unavailable(self.settings.retry_after_s) from exc
        self._start_mirror(stream)
        await self._own(stream_id)
        return stream.policy

    def _start_mirror(self, stream: SharedStream) -> None:
        self._mirrors.add(stream.mirror)
        stream.mirror.start(self.settings.redis_tombstone_s).add_done_callback(
            lambda _: self._mirrors.discard(stream.mirror))

    def _on_command(self, op: str, stream_id: str, reason: str) -> None:
        stream = self.local(stream_id)
        if not isinstance(stream, SharedStream):
            return
        if op == "cancel":
            stream.cancel(reason)
        elif op == "attached":
            stream.remote_attached()
        elif op == "left":
            stream.remote_left()

    # ---- reading -----------------------------------------------------------------------
    def _bounded(self) -> asyncio.Timeout:
        """One deadline for all the store calls of one request. Each call has its
        own socket timeout, but a request makes several in a row (the meta, the
        log's first entry, the followers) and a fresh connection adds its
        handshake: through a black-holed store a resume took 1-3 s and more to
        get its 503 (store-faults). TimeoutError is one of STORE_ERRORS."""
        return asyncio.timeout(self.settings.redis_timeout_s)

    async def find(self, stream_id: str, owner: str) -> FoundStream:
        stream = find_local(self.memory.registry, stream_id, owner)
        if stream is not None and not stream.handed_off:
            # We own it: served from memory, Redis or not. Taken over from
            # another replica, the events before are in Redis (follow reads them).
            first = stream.log.first_seq
            if first > 1:
                with contextlib.suppress(*STORE_ERRORS):
                    async with self._bounded():
                        first = min(first, await first_seq(
                            self.redis, stream_keys(KEY_PREFIX, stream.id),
                            stream.log.last_seq))
            return FoundStream(id=stream.id, last_seq=stream.log.last_seq,
                               first_seq=first, ended=stream.ended,
                               retry_ms=stream.policy.retry_ms,
                               age_s=time.monotonic() - stream.created)
        if not is_stream_id(stream_id):
            raise unknown(stream_id)
        keys = stream_keys(KEY_PREFIX, stream_id)
        try:
            async with self._bounded():
                meta = await read_meta(self.redis, keys)
                if meta is None:
                    gone_owner = await self.redis.get(keys.gone)
                    if gone_owner is not None and gone_owner in ("", owner):
                        raise expired(stream_id)
                    raise unknown(stream_id)
                first = await first_seq(self.redis, keys, meta.last_seq)
        except STORE_ERRORS as exc:
            self.store_metrics.read_failures.inc()
            raise store_unavailable(self.settings.retry_after_s) from exc
        if meta.owner not in (None, owner):
            raise unknown(stream_id)
        return FoundStream(id=stream_id, last_seq=meta.last_seq, first_seq=first,
                           ended=meta.ended, retry_ms=meta.retry_ms,
                           age_s=time.time() - meta.created, owner_replica=meta.replica,
                           ahead=0 if meta.ended else self.settings.redis_pending_max_events)

    async def status(self, found: FoundStream) -> dict[str, Any]:
        """The same record (attaches, readers, followers) whichever replica
        answers: it is read from the store (services/gateway/resume/record.py)."""
        stream = self.local(found.id)
        keys = stream_keys(KEY_PREFIX, found.id)
        if stream is not None:
            snapshot = {**stream.snapshot(), "replica": self.settings.replica_id}
            # Its readers on every replica, as the others answer; the owner's
            # own memory when the store cannot say (it still knows its own).
            with contextlib.suppress(*STORE_ERRORS):
                async with self._bounded():
                    attaches, readers = await read_record(self.redis, keys)
                if attaches:
                    snapshot.update(attaches=attaches, readers=readers,
                                    followers=len(readers))
            return snapshot
        try:
            async with self._bounded():
                meta = await read_meta(self.redis, keys)
                if meta is None:
                    raise expired(found.id)
                first = await first_seq(self.redis, keys, meta.last_seq)
                attaches, readers = await read_record(self.redis, keys)
        except STORE_ERRORS as exc:
            self.store_metrics.read_failures.inc()
            raise store_unavailable(self.settings.retry_after_s) from exc
        return {"id": found.id, "state": meta.state.value, "cancel_reason": meta.cancel_reason,
                # every replica's readers, as the owner answers
                "followers": len(readers), "first_seq": first, "last_seq": meta.last_seq,
                "last_event_id": event_id(found.id, meta.last_seq), "replay_bytes": None,
                "grace_s": meta.grace_s, "ttl_s": meta.ttl_s, "attaches": attaches,
                "readers": readers, "replica": meta.replica}

    async def attached(self, found: FoundStream, record: Attach) -> None:
        """Write the reader into the shared record before its response starts
        (a browser that resumed and asked for the status on open was missing
        from it: the write was in the background). Bounded, and skipped while
        the store has just failed, so an owner's readers never wait on a store
        that is down; then the record lacks them (best effort)."""
        record = self.stamped(record)
        self._prewritten.add(record.reader)
        if self.store_metrics.store_failed_within(RECORD_SKIP_AFTER_FAILURE_S):
            return
        try:
            await self.record.attach(stream_keys(KEY_PREFIX, found.id), record)
        except STORE_ERRORS:
            self.store_metrics.write_failures.inc()
            self.store_metrics.store_failed()

    def attempted(self, stream_id: str, record: Attach) -> None:
        """In the background, with a longer bound than a request's: the read
        that failed was most often a timeout on a loaded machine with Redis
        up, and the owner reads this list before it cancels a stream
        `never_attached` (SharedStream._check_once)."""
        if is_stream_id(stream_id):
            self.record.attempted(stream_keys(KEY_PREFIX, stream_id), self.stamped(record),
                                  timeout_s=ATTEMPT_WRITE_BOUND * self.settings.redis_timeout_s)

    def follow(self, found: FoundStream, after: int, record: Attach
               ) -> AsyncIterator[ServerSentEvent]:
        record = self.stamped(record)
        keys = stream_keys(KEY_PREFIX, found.id)
        if record.reader in self._prewritten:
            self._prewritten.discard(record.reader)
        else:  # a surface that did not call `attached` (its response has started)
            self.record.background(keys, record)
        return self._recorded(keys, record, self._events(found, after, record, keys))

    async def _recorded(self, keys: StreamKeys, record: Attach,
                        events: AsyncIterator[ServerSentEvent]
                        ) -> AsyncIterator[ServerSentEvent]:
        """The reader is in `readers` while it reads, on whichever replica."""
        self.record.reading(keys, record)
        try:
            async for event in events:
                yield event
        finally:
            self.record.left(record)
            aclose = getattr(events, "aclose", None)  # the reader's own detach
            if aclose is not None:
                await aclose()

    def _events(self, found: FoundStream, after: int, record: Attach, keys: StreamKeys
                ) -> AsyncIterator[ServerSentEvent]:
        stream = self.local(found.id)
        if stream is not None and after + 1 >= stream.log.first_seq:
            return follow_local(stream, after, record)
        # Elsewhere, or taken over here after what the client asks for: from Redis.
        presence = Presence(self.redis, keys, self.settings.replica_id,
                            self.settings.redis_follower_ttl_s)
        def local_after(stream_id: str, cursor: int) -> AsyncIterator[ServerSentEvent] | None:
            stream = self.local(stream_id)
            if stream is None or not stream.log.first_seq <= cursor + 1 <= stream.log.last_seq + 1:
                return None
            return follow_local(stream, cursor, record)

        events = tail(self.tail_redis, keys, found.id, after=after, retry_ms=found.retry_ms,
                      presence=presence, block_s=self.block_s,
                      timeout_s=self.settings.redis_timeout_s,
                      retry_after_s=self.settings.retry_after_s, metrics=self.store_metrics,
                      owner_gone=self._owner_gone, local_after=local_after,
                      retryable=self.settings.resume_transient == "retry")
        if found.ended or found.owner_replica is None:
            return events
        return self._announced(found.id, found.owner_replica, events)

    async def _announced(self, stream_id: str, owner: str,
                         events: AsyncGenerator[ServerSentEvent, None]
                         ) -> AsyncIterator[ServerSentEvent]:
        """Tell the owner a reader attached here (best effort: its grace check
        finds the reader's presence anyway), so a stream first read on another
        replica is not cancelled as never attached."""
        await self._tell_owner(owner, "attached", stream_id)
        try:
            async with contextlib.aclosing(events):  # its presence is gone after this
                async for event in events:
                    yield event
        finally:
            # And that it left (best effort, bounded): the owner's grace starts
            # now, not at its next look at the store (a grace of 0 read here
            # used to run on for up to a third of the follower TTL).
            await self._tell_owner(owner, "left", stream_id)

    async def _tell_owner(self, owner: str, op: str, stream_id: str) -> None:
        """Best effort and bounded: a failure must not cut the reader's response."""
        try:
            async with asyncio.timeout(self.settings.redis_timeout_s):
                await self.control.send(owner, op, stream_id)
        except STORE_ERRORS:
            pass
        except Exception as exc:  # as a store error: the owner's grace check finds out
            self.store_metrics.tasks.caught("presence", stream_id, exc,
                                            f"the owner is not told {op!r}")

    # ---- control -----------------------------------------------------------------------
    async def cancel(self, found: FoundStream, reason: str) -> dict[str, Any]:
        stream = self.local(found.id)
        if stream is not None:
            stream.cancel(reason)
            return await self.status(found)
        keys = stream_keys(KEY_PREFIX, found.id)
        try:
            meta = await read_meta(self.redis, keys)
            if meta is not None and not meta.ended:
                received = await self.control.send(meta.replica, "cancel", found.id, reason)
                if received == 0:
                    await self._end_orphaned(keys, meta, reason)
                    if self.settings.reattach:
                        await self._cancel_at_engine(found.id)
                await self._wait_ended(keys)
        except STORE_ERRORS as exc:
            self.store_metrics.read_failures.inc()
            raise store_unavailable(self.settings.retry_after_s) from exc
        return await self.status(found)

    async def _cancel_at_engine(self, stream_id: str) -> None:
        """The owner is gone but its detachable generation may still run (an
        orphan, for its grace): a DELETE must stop it now."""
        if self._gateway is None:
            return
        try:
            await self._gateway.engine.cancel(stream_id)
        except EngineError as exc:
            log.warning("stream %s: explicit cancel failed (%s); the engine stops it "
                        "when its orphan grace ends", stream_id, exc.message)

    async def _owner_gone(self, stream_id: str, keys: StreamKeys, meta: StreamMeta,
                          cursor: int) -> bool:
        """A reader's check while its stream is quiet: has the owning replica
        stopped running (its alive key expired) or handed the stream off (a
        drain)? Then take the stream over and re-attach to the engine's
        generation; if that cannot be (re-attach off, the engine no longer
        holds it), end the stream `owner_lost`, so the reader gets a terminal
        event instead of pings forever. False: the owner is there, or another
        replica won the stream."""
        if meta.replica == self.settings.replica_id and self.local(stream_id) is not None:
            # Taken over here (by the sweep, or another reader): the reader
            # follows this replica's memory from now on.
            return True
        if self._claimed_not_run(stream_id, meta):
            # Claimed here, but its adoption never ran to the end (the claim's
            # reply was lost to a timeout, or the task that claimed it was
            # cancelled before it could start one): every replica sees its owner,
            # this one, alive, so nobody else will. Run it now.
            return await self._run_claimed(stream_id, keys, meta, meta.last_seq, cursor)
        if meta.replica != RELEASED:
            alive = await self._alive(meta.replica)
            if alive is not None and meta.incarnation in ("", alive):
                return False  # it runs (a restarted one under its name does not count)
            if self.store_metrics.heartbeat_failed_within(OWNER_SILENCE_AFTER_OUTAGE_S):
                # This replica's own heartbeat could not reach the store a
                # moment ago either: the owner's key most likely expired in the
                # same outage, not with the owner. Judge again once the owner
                # had time to refresh it. Only the heartbeat counts here (the
                # control channel's, once a second), never a reader's call that
                # timed out: under a reconnect storm of hundreds of readers such
                # timeouts came every second, each one put the take-over off by
                # this window again, and the lost owner's generations outlived
                # the engine's orphan grace (`owner_lost`).
                return False
        if meta.replica in self._sweeping:
            # This replica's sweep is taking the lost owner's streams over:
            # wait for it rather than race it for the claim. Hundreds of
            # readers polling and claiming at once were most of what a
            # storm's survivor had to do while the orphans' grace ran.
            await asyncio.sleep(SWEEP_S)
            return False
        if self._gateway is not None and self._gateway.drain.draining:
            # Taken over here, it would be cancelled (`gateway_shutdown`) when
            # this replica exits: rolling-deploy lost streams so. Let the reader
            # move to a replica that stays; that one takes it over.
            raise ReaderMustMove
        return await self._take_over(stream_id, keys, meta, cursor)

    async def _take_over(self, stream_id: str, keys: StreamKeys, meta: StreamMeta,
                         cursor: int) -> bool:
        """The owner is gone: claim the stream and re-attach to its generation
        (or, when that cannot be, end it `owner_lost`). False: another
        replica took it first, or it ended meanwhile."""
        if not self.settings.reattach or self._gateway is None:
            await self._end_orphaned(keys, meta, "owner_lost", cursor)
            return True
        last_seq = int(await self._claim(
            keys=[keys.meta, replica_key(KEY_PREFIX, meta.replica)],
            args=[meta.replica, self.settings.replica_id, meta.incarnation,
                  self.control.incarnation]))
        if last_seq < 0:
            return False  # another replica took it first, or it ended meanwhile
        return await self._run_claimed(stream_id, keys, meta, last_seq, cursor)

    def _claimed_not_run(self, stream_id: str, meta: StreamMeta) -> bool:
        """This incarnation claimed it (the meta names it), yet it neither runs
        here nor is being adopted."""
        return (meta.replica == self.settings.replica_id
                and meta.incarnation == self.control.incarnation
                and self.local(stream_id) is None and stream_id not in self._adopting)

    async def _run_claimed(self, stream_id: str, keys: StreamKeys, meta: StreamMeta,
                           last_seq: int, cursor: int) -> bool:
        """The claim is this replica's: adopt the stream in a task of its own,
        which whoever claimed it (a reader, the sweep) waits on but cannot
        cancel. A reader that left mid-take-over cancelled its request, and
        with it the adoption, leaving the stream claimed, not run and `running`
        in Redis for an hour; now the adoption goes on without it."""
        task = self._adopting.get(stream_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._adopt_claimed(stream_id, keys, meta, last_seq, cursor),
                name=f"takeover-{stream_id}")
            self._adopting[stream_id] = task
            task.add_done_callback(lambda _: self._adopting.pop(stream_id, None))
            self.store_metrics.tasks.watch(task, "takeover", stream_id)
        await asyncio.shield(task)
        return True

    async def _adopt_claimed(self, stream_id: str, keys: StreamKeys, meta: StreamMeta,
                             last_seq: int, cursor: int) -> None:
        deadline = time.monotonic() + self.settings.takeover_window_s
        while True:
            try:
                await self._adopt(stream_id, meta, last_seq)
            except EngineError as exc:
                if exc.status_code in (503, 504) and time.monotonic() < deadline:
                    # An engine that did not answer in time (a loaded one,
                    # its hop down) may still hold the generation: a 404 is
                    # the only "gone". Ending it `owner_lost` here lost
                    # streams whose generation was there all along.
                    await asyncio.sleep(REATTACH_BACKOFF_S)
                    continue
                log.warning("stream %s: owner %r lost and its generation cannot be "
                            "re-attached (%s)", stream_id, meta.replica, exc.message)
                self.store_metrics.takeovers.labels("owner_lost").inc()
                await self._end_claimed(keys, meta, cursor)
            except Exception as exc:  # anything else: the claim must not be left unrun
                await self._adoption_failed(stream_id, keys, meta, cursor, exc)
            return

    async def _end_claimed(self, keys: StreamKeys, meta: StreamMeta, cursor: int) -> None:
        """End a stream claimed here `owner_lost` in the log, trying a store
        error again with a backoff for up to CLAIMED_END_RETRY_S."""
        deadline = time.monotonic() + CLAIMED_END_RETRY_S
        delay = 0.1
        while True:
            try:
                await self._end_orphaned(keys, meta, "owner_lost", cursor)
                return
            except STORE_ERRORS as exc:
                if time.monotonic() + delay > deadline:
                    log.warning("stream %s: could not end it owner_lost for %.0f s (%r); "
                                "its metadata's TTL ends it", keys.meta, CLAIMED_END_RETRY_S,
                                exc)
                    return
                await asyncio.sleep(delay)
                delay = min(2 * delay, RETRY_MAX_S)

    async def _adoption_failed(self, stream_id: str, keys: StreamKeys, meta: StreamMeta,
                               cursor: int, exc: Exception) -> None:
        """The claim is this replica's, but adopting the stream failed with
        something other than the engine's answer (a lease the gateway refused,
        a store error, a bug): left so, nobody would advance it (every replica
        sees its owner, this one, alive). End it: here, if it runs here already
        (its log writer writes the end), else in the log."""
        if isinstance(exc, STORE_ERRORS):
            log.warning("stream %s: taking it over failed (%r); ending it owner_lost",
                        stream_id, exc)
        else:
            self.store_metrics.tasks.caught("takeover", stream_id, exc,
                                            "the stream is ended owner_lost")
        self.store_metrics.takeovers.labels("owner_lost").inc()
        stream = self.local(stream_id)
        if stream is not None:
            stream.cancel("owner_lost")
        else:
            await self._end_claimed(keys, meta, cursor)

    # ---- the take-over sweep: a lost owner's streams, whether or not anyone reads ----
    async def _own(self, stream_id: str) -> None:
        """List the stream among this replica's (best effort: without it the
        stream is still taken over, by its readers)."""
        try:
            async with self._bounded(), self.redis.pipeline(transaction=False) as pipe:
                pipe.sadd(self._owned_key, stream_id)
                pipe.pexpire(self._owned_key, self._owned_ttl_ms)
                pipe.sadd(replicas_key(KEY_PREFIX), self.settings.replica_id)
                await pipe.execute()
        except STORE_ERRORS:
            pass
        except Exception as exc:  # best effort, as a store error
            self.store_metrics.tasks.caught("owned_list", stream_id, exc,
                                            "its readers take it over if this replica dies")

    def disown(self, stream_id: str) -> None:
        """It ended here, or another replica runs it now (in the background,
        best effort: the sweep skips what is not running and owned by its owner)."""
        async def remove() -> None:
            try:
                async with self._bounded():
                    await self.redis.srem(self._owned_key, stream_id)
            except STORE_ERRORS:
                pass
            except Exception as exc:  # best effort, as a store error
                self.store_metrics.tasks.caught("owned_list", stream_id, exc,
                                                "the sweep skips it (not running here)")

        with contextlib.suppress(RuntimeError):  # no loop left: the key expires
            task = asyncio.get_running_loop().create_task(remove(), name=f"disown-{stream_id}")
            self._disowning.add(task)
            task.add_done_callback(self._disowning.discard)

    async def _sweep_forever(self) -> None:
        """Every SWEEP_S: is a replica that owns streams gone? Take all of its
        streams over now, not when each one's reader comes back and looks (a
        storm's readers come back over seconds, their tails cost the store a
        call each, and a lost owner's generations waited on them past the
        engine's orphan grace). The bound is the alive key's expiry plus one
        sweep, whatever the readers do (docs/resume.md)."""
        unexpected = 0  # unexpected failures in a row: the first is logged in full
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                await self._sweep()
                unexpected = 0
            except STORE_ERRORS as exc:
                log.warning("take-over sweep failed (%r); again in %.1f s", exc, SWEEP_S)
            except Exception as exc:  # the sweep must outlive any one failure
                self.store_metrics.tasks.caught("takeover", "the sweep", exc,
                                                f"again in {SWEEP_S:.1f} s",
                                                repeat=unexpected > 0)
                unexpected += 1

    async def _sweep(self) -> None:
        if (not self.settings.reattach or self._gateway is None
                or self._gateway.drain.draining
                or self.store_metrics.heartbeat_failed_within(OWNER_SILENCE_AFTER_OUTAGE_S)):
            return
        async with asyncio.timeout(SWEEP_TIMEOUT_S):
            replicas: set[str] = await self.redis.smembers(replicas_key(KEY_PREFIX))
        for replica in sorted(replicas - {self.settings.replica_id}):
            async with asyncio.timeout(SWEEP_TIMEOUT_S):
                if await self.redis.get(replica_key(KEY_PREFIX, replica)) is not None:
                    continue  # it runs
                ids: set[str] = await self.redis.smembers(owned_key(KEY_PREFIX, replica))
                if not ids:
                    await self.redis.srem(replicas_key(KEY_PREFIX), replica)
                    continue
            log.warning("replica %r is gone; taking over its %d stream(s)", replica, len(ids))
            limit = asyncio.Semaphore(TAKEOVER_CONCURRENCY)
            self._sweeping.add(replica)
            try:
                results = await asyncio.gather(
                    *(self._sweep_one(replica, i, limit) for i in sorted(ids)),
                    return_exceptions=True)
            finally:
                self._sweeping.discard(replica)
            for stream_id, result in zip(sorted(ids), results, strict=True):
                # Each is taken again at the next sweep (still in the lost
                # replica's list), or by its readers.
                if isinstance(result, STORE_ERRORS):
                    log.warning("stream %s: take-over failed (%r); again at the next sweep",
                                stream_id, result)
                elif isinstance(result, Exception):
                    self.store_metrics.tasks.caught("takeover", stream_id, result,
                                                    "again at the next sweep")

    async def _sweep_one(self, replica: str, stream_id: str, limit: asyncio.Semaphore) -> None:
        async with limit:
            keys = stream_keys(KEY_PREFIX, stream_id)
            async with asyncio.timeout(SWEEP_TIMEOUT_S):
                meta = await read_meta(self.redis, keys)
            if meta is not None and not meta.ended and meta.replica == replica:
                await self._take_over(stream_id, keys, meta, meta.last_seq)
            elif meta is not None and not meta.ended and self._claimed_not_run(stream_id, meta):
                # Claimed here by an earlier sweep whose reply was lost (a
                # timeout): still in the lost replica's list, and nobody reads it.
                await self._run_claimed(stream_id, keys, meta, meta.last_seq, meta.last_seq)
            async with asyncio.timeout(SWEEP_TIMEOUT_S):
                await self.redis.srem(owned_key(KEY_PREFIX, replica), stream_id)

    async def _alive(self, replica: str) -> str | None:
        """A replica's alive key, asked at most once per poll interval."""
        now = time.monotonic()
        seen = self._alive_seen.get(replica)
        if seen is not None and now - seen[0] < self.block_s:
            return seen[1]
        alive: str | None = await self.redis.get(replica_key(KEY_PREFIX, replica))
        if len(self._alive_seen) > 1000:
            self._alive_seen.clear()
        self._alive_seen[replica] = (now, alive)
        return alive

    async def _adopt(self, stream_id: str, meta: StreamMeta, last_seq: int) -> None:
        """Own a stream claimed from a lost replica: re-attach to its generation
        after the last token the log holds, and continue the log from there.

        Token index i is the log's event i + 1 (a running stream's log holds
        only tokens), so the log's last sequence number names the token to
        re-attach after. If the engine no longer buffers that far back (the old
        owner's last batches never reached Redis, and more than the engine's
        buffer has been made since), continue from the oldest token it holds:
        the hole in the sequence numbers is told to readers as `gap`."""
        assert self._gateway is not None
        after_index = last_seq - 1 if last_seq > 0 else None
        # Parented on the stream's own span (its meta), not on whoever caused
        # the take-over: the sweep has no trace, a reader may have another.
        traceparent = meta.traceparent or None
        lease = self._gateway.lease(None, stream_id, meta.owner, surface="resume",
                                    traceparent=traceparent)
        try:
            await lease.attach(after_index)
        except EngineError as exc:
            oldest = OLDEST_HELD.search(exc.message)
            if exc.code != "out_of_range" or oldest is None:
                raise
            after_index = int(oldest.group(1)) - 1
            lease = self._gateway.lease(None, stream_id, meta.owner, surface="resume",
                                        traceparent=traceparent)
            await lease.attach(after_index)
        policy = StreamPolicy(grace_s=meta.grace_s, ttl_s=meta.ttl_s, retry_ms=meta.retry_ms,
                              max_events=meta.max_events)
        after_seq = 0 if after_index is None else after_index + 1
        stream = self.memory.registry.create(stream_id, lease, policy, self._build, after_seq)
        assert isinstance(stream, SharedStream)
        stream.created_unix = meta.created
        self._start_mirror(stream)
        await self._own(stream_id)
        self.store_metrics.takeovers.labels("reattached").inc()
        log.info("stream %s: took over from %r after token %s", stream_id,
                 meta.replica or "(handed off)", after_index)

    async def _end_orphaned(self, keys: StreamKeys, meta: StreamMeta, reason: str,
                            after: int = 0) -> None:
        """Nobody owns it any more (its replica is gone, and its engine call
        with it): end it in the log, so every reader gets a terminal event."""
        log.warning("stream %s: owner %s is not listening; ending it in the log",
                    keys.meta, meta.replica)
        await self._end_orphan(keys=[keys.events, keys.meta],
                               args=[json.dumps({"reason": reason}, separators=(",", ":")),
                                     f"{reason}", meta.max_events, after])

    async def _wait_ended(self, keys: StreamKeys) -> None:
        """Until the owner has written the end (bounded: the owner may be slow)."""
        deadline = time.monotonic() + self.settings.redis_timeout_s
        while time.monotonic() < deadline:
            meta = await read_meta(self.redis, keys)
            if meta is None or meta.ended:
                return
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for adopting in list(self._adopting.values()):
            adopting.cancel()  # claimed, not run: a reader on a survivor takes it over
        await asyncio.gather(*self._adopting.values(), return_exceptions=True)
        for stream in self.memory.registry.running():
            if isinstance(stream, SharedStream):
                stream.hand_off_at_exit()
        await self.memory.close()  # cancels what is left; the mirrors write the ends
        await asyncio.gather(*(m.stop(self.settings.redis_timeout_s) for m in self._mirrors),
                             return_exceptions=True)
        await self.control.stop()
        await self.record.close()
        await asyncio.gather(*self._disowning, return_exceptions=True)  # each bounded
        for client in (self.redis, self.tail_redis, self.patient_redis):
            with contextlib.suppress(*STORE_ERRORS):
                await client.aclose()

