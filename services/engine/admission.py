"""Admission control: how many generations run at once, and how many may wait.

A generation holds a GPU slot (KV cache, a batch seat) for as long as it runs,
so the engine caps them; a bounded queue absorbs bursts; past that it refuses
at once with RESOURCE_EXHAUSTED, before anything has started, and the gateway
turns that into `429 Retry-After`. A caller cancelled while queued simply
leaves the queue.
"""

from __future__ import annotations

import asyncio


class Admission:
    def __init__(self, running: int, queued: int) -> None:
        self._slots = asyncio.Semaphore(running)
        self._running_limit = running
        self._queued_limit = queued
        self.waiting = 0
        self.running = 0

    @property
    def running_limit(self) -> int:
        return self._running_limit

    @property
    def queued_limit(self) -> int:
        return self._queued_limit

    def would_wait(self) -> bool:
        """Whether a call arriving now would queue for a slot."""
        return self._slots.locked()

    def full(self) -> bool:
        return self._slots.locked() and self.waiting >= self._queued_limit

    def describe(self) -> str:
        return (f"engine at capacity: {self.running}/{self._running_limit} generating, "
                f"{self.waiting}/{self._queued_limit} queued")

    async def acquire(self) -> None:
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1

    def release(self) -> None:
        self.running -= 1
        self._slots.release()
