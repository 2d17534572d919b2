"""Per-identity caps counted across replicas, in the shared store (Redis).

Each gateway's StreamLimiter (services/gateway/limits.py) counts only its own
streams, so with N replicas behind one edge a client's cap of 64 was N × 64
(and in the default lab every edge client is one identity). With the shared
resume store on, each slot is also taken in Redis, where every replica counts
the same set:

    streamlab:caps:<identity>   Sorted set: one member per open slot
                                ("<replica>/<slot id>"), scored with the unix
                                ms its lease ends at

Taking a slot is one Lua script (trim expired members, count, add if under
the cap: no two replicas can both take the last slot). The replica that holds
a slot renews its lease every third of `lease_s` and removes it when the
stream ends; a replica that is killed stops renewing, so its slots come back
within `lease_s` (the bound a killed gateway's clients wait; shorter means
more renewal traffic: one pipeline per replica per `lease_s / 3`, whatever
the number of slots).

The store down: a slot is admitted on the local count alone (the per-replica
cap still holds, so at most N × the cap), and the store is not asked again
for FAIL_OPEN_S, so a store outage never delays or refuses every new stream.
Refusing all new work while Redis is down would turn a store fault into an
outage of the whole surface, which the resume store itself avoids too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter

from services.gateway.limits import TooManyStreams
from services.gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("streamlab.gateway")

KEY_PREFIX = "streamlab:caps"
FAIL_OPEN_S = 5.0  # after a store failure, count locally only for this long
# KEYS the identity's set; ARGV cap, member, lease end (unix ms), now (unix
# ms), the key's TTL (ms). 1: taken; 0: the identity is at its cap.
ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[4]))
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[5]))
return 1
"""


def caps_key(identity: str) -> str:
    return f"{KEY_PREFIX}:{identity}"


class SharedSlot:
    def __init__(self, caps: SharedCaps, key: str, member: str) -> None:
        self._caps = caps
        self.key = key
        self.member = member
        self._held = True

    def release(self) -> None:
        """Idempotent and synchronous (a lease closes in any `finally`)."""
        if self._held:
            self._held = False
            self._caps._release(self)


class SharedCaps:
    def __init__(self, redis_url: str, per_client: int, lease_s: float, timeout_s: float,
                 retry_after_s: int, replica: str, registry: CollectorRegistry) -> None:
        # Imported here: a gateway without the shared store never loads redis-py.
        from redis.exceptions import RedisError

        from services.gateway.resume.redis_client import CancelSafeRedis

        self._errors = (RedisError, OSError, TimeoutError)
        # The resume store's client: a request cancelled mid-acquire (its client
        # left) must not have the cancel swallowed by redis-py's wait_for
        # (resume/redis_client.py says where), or it would go on to start a
        # stream for nobody.
        self._redis: Redis = CancelSafeRedis.from_url(
            redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            decode_responses=True)
        self._per_client = per_client
        self._lease_s = lease_s
        self._timeout_s = timeout_s
        self._retry_after_s = retry_after_s
        self._replica = replica
        self._acquire = self._redis.register_script(ACQUIRE)
        self._held: dict[str, SharedSlot] = {}  # by member
        self._failed_at = -float("inf")
        self._renewer: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[None]] = set()
        self.unavailable = Counter(
            "streamlab_gateway_shared_caps_unavailable",
            "Slots admitted on this gateway's own count: the shared store failed",
            registry=registry)
        self.refused = Counter(
            "streamlab_gateway_shared_caps_refused",
            "Streams refused because the identity's cap was full across replicas",
            registry=registry)

    @property
    def held(self) -> int:
        return len(self._held)

    def _ms(self, seconds: float) -> int:
        return int(seconds * 1000)

    async def acquire(self, identity: str) -> SharedSlot | None:
        """A slot in the shared count; TooManyStreams at the cap; None when
        the store cannot say (admitted on the local count)."""
        if time.monotonic() - self._failed_at < FAIL_OPEN_S:
            self.unavailable.inc()
            return None
        self._start_renewing()
        key = caps_key(identity)
        member = f"{self._replica}/{uuid.uuid4().hex[:12]}"
        now = time.time()
        try:
            async with asyncio.timeout(self._timeout_s):
                taken = await self._acquire(
                    keys=[key], args=[self._per_client, member,
                                      self._ms(now + self._lease_s), self._ms(now),
                                      self._ms(self._lease_s * 2)])
        except self._errors as exc:
            self._failed_at = time.monotonic()
            self.unavailable.inc()
            log.warning("shared caps: store unavailable (%s); counting on this gateway "
                        "only for %.0f s", exc, FAIL_OPEN_S)
            return None
        if not taken:
            self.refused.inc()
            raise TooManyStreams(
                f"too many streams for this client: {self._per_client} open across "
                "the gateways", self._retry_after_s)
        slot = SharedSlot(self, key, member)
        self._held[member] = slot
        return slot

    def _release(self, slot: SharedSlot) -> None:
        self._held.pop(slot.member, None)
        self._spawn(self._remove(slot), f"caps-release-{slot.member}")

    async def _remove(self, slot: SharedSlot) -> None:
        with contextlib.suppress(*self._errors):
            async with asyncio.timeout(self._timeout_s):
                await self._redis.zrem(slot.key, slot.member)

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    def _start_renewing(self) -> None:
        if self._renewer is None:
            self._renewer = asyncio.get_running_loop().create_task(self._renew(),
                                                                   name="shared-caps")

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self._lease_s / 3)
            slots = list(self._held.values())
            if not slots:
                continue
            ends = self._ms(time.time() + self._lease_s)
            with contextlib.suppress(*self._errors):
                async with asyncio.timeout(self._timeout_s):
                    async with self._redis.pipeline(transaction=False) as pipe:
                        # Not XX: a slot lost with the store's data (a restart
                        # without persistence) is counted again while held. One
                        # released meanwhile may come back: it expires within the lease.
                        for slot in slots:
                            pipe.zadd(slot.key, {slot.member: ends})
                        for key in {slot.key for slot in slots}:
                            pipe.pexpire(key, self._ms(self._lease_s * 2))
                        await pipe.execute()

    async def close(self) -> None:
        """Shutdown: stop renewing; give the releases a bounded chance."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        await asyncio.gather(*self._writes, return_exceptions=True)  # each bounded
        with contextlib.suppress(*self._errors):
            await self._redis.aclose()


def build_shared_caps(settings: GatewaySettings, registry: CollectorRegistry) -> SharedCaps | None:
    """Counted in Redis when the replicas share it (the Redis resume store) and
    `shared_caps_lease_s` > 0; else None (each gateway counts alone)."""
    if settings.resume_store != "redis" or settings.shared_caps_lease_s <= 0:
        return None
    return SharedCaps(settings.redis_url, settings.max_streams_per_client,
                      settings.shared_caps_lease_s, settings.redis_timeout_s,
                      settings.retry_after_s, settings.replica_id, registry)
