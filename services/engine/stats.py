"""What the engine generated, and what it generated after a cancel arrived.

One GenerationRecord per call. The servicer marks the cancel the moment it
learns of it (the RPC's done-callback or the CancelledError, whichever comes
first); every token the backend reports after that counts as wasted work.
Backends may report tokens from a worker thread, hence the lock.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.generation import GenerationState


@dataclass
class GenerationRecord:
    request_id: str
    started_at: float
    state: GenerationState = GenerationState.RUNNING
    tokens_generated: int = 0
    tokens_after_cancel: int = 0
    cancelled_at: float = 0.0
    ended_at: float = 0.0
    # The request's sampling options, as received (None: it sent none).
    sampling: pb.SamplingOptions | None = None
    _stats: EngineStats | None = field(default=None, repr=False)

    def generated(self) -> None:
        """Called by the backend once per decode step (any thread)."""
        assert self._stats is not None
        self._stats.count_token(self)

    @property
    def cancel_seen(self) -> bool:
        return self.cancelled_at > 0.0


class EngineStats:
    def __init__(self, history: int) -> None:
        self._lock = threading.Lock()
        self._history = history
        self._records: OrderedDict[str, GenerationRecord] = OrderedDict()
        self.tokens_generated = 0
        self.tokens_after_cancel = 0
        self.started = 0
        self.completed = 0
        self.cancelled = 0
        self.failed = 0
        # Detachable generations (services/engine/detached.py): callers that
        # vanished, Attaches that picked one up, graces that ran out.
        self.orphaned = 0
        self.reattached = 0
        self.orphan_expired = 0
        # Multiplexed Session calls open now (services/engine/session.py): 0
        # while every gateway speaks the per-request wire.
        self.sessions_open = 0

    @staticmethod
    def now() -> float:
        """CLOCK_MONOTONIC seconds. On Linux it is one clock for every process on
        the machine, so a client in another process can subtract its own
        time.monotonic() of a close from `cancelled_at` to get the cancel latency."""
        return time.monotonic()

    @property
    def active(self) -> int:
        with self._lock:
            return sum(1 for r in self._records.values() if r.state is GenerationState.RUNNING)

    def begin(self, request_id: str, sampling: pb.SamplingOptions | None = None
              ) -> GenerationRecord:
        record = GenerationRecord(request_id=request_id, started_at=self.now(),
                                  sampling=sampling, _stats=self)
        with self._lock:
            self.started += 1
            self._records[request_id] = record
            self._records.move_to_end(request_id)
            self._evict_finished()
        return record

    def count_token(self, record: GenerationRecord) -> None:
        with self._lock:
            record.tokens_generated += 1
            self.tokens_generated += 1
            if record.cancel_seen:
                record.tokens_after_cancel += 1
                self.tokens_after_cancel += 1

    def mark_cancel(self, record: GenerationRecord) -> None:
        with self._lock:
            if not record.cancel_seen and record.state is GenerationState.RUNNING:
                record.cancelled_at = self.now()

    def end(self, record: GenerationRecord, state: GenerationState) -> None:
        with self._lock:
            if record.state is not GenerationState.RUNNING:
                return
            record.state = state
            record.ended_at = self.now()
            if state is GenerationState.COMPLETED:
                self.completed += 1
            elif state is GenerationState.CANCELLED:
                self.cancelled += 1
            else:
                self.failed += 1

    def records(self, request_id: str = "") -> list[GenerationRecord]:
        with self._lock:
            if request_id:
                found = self._records.get(request_id)
                return [found] if found else []
            return list(self._records.values())

    def _evict_finished(self) -> None:
        # Running generations are never evicted: a test may still ask about them.
        excess = len(self._records) - self._history
        if excess <= 0:
            return
        oldest_finished = (k for k, r in self._records.items()
                           if r.state is not GenerationState.RUNNING)
        for key in list(itertools.islice(oldest_finished, excess)):
            del self._records[key]
