"""Commands between replicas: a DELETE (or any stop) on one replica reaches
the replica that owns the engine call, over Redis pub/sub.

Each replica subscribes to its own channel (`<prefix>:control:<replica id>`)
and acts on `{"op": "cancel", "id": ..., "reason": ...}` by cancelling its
local stream, exactly as a local DELETE does, and on `{"op": "attached"}` (a
reader came to another replica) by watching the remote readers instead of
running its never-attached or grace timer. Pub/sub rather than a control
stream: a command is only useful to the owner while it is alive and
subscribed, and PUBLISH says how many received it, so the sender knows at
once when the owner is gone (then nothing is running to cancel: its engine
call died with it, and the sender ends the stream in the log itself).

The subscription reconnects with a backoff while Redis is down; commands sent
meanwhile are lost, which the sender sees as 0 receivers. Any other exception
is handled alike (counted in streamlab_gateway_resume_task_failures_total
{task="control"}, logged, resubscribed): the loop also keeps this replica's
alive key fresh, and were it to die, every other replica would take this
one's streams over while it still ran them; a command whose handling fails
is counted and logged, and the loop goes on to the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable

from redis.asyncio import Redis

from services.gateway.resume.redis_keys import ALIVE_TTL_S, control_channel, replica_key
from services.gateway.resume.redis_log import RETRY_FIRST_S, RETRY_MAX_S, STORE_ERRORS
from services.gateway.resume.tasks import TaskFailures

log = logging.getLogger("streamlab.gateway")

POLL_S = 1.0  # how long one get_message waits: bounds how late a shutdown notices


class ControlChannel:
    def __init__(self, redis: Redis, prefix: str, replica: str,
                 on_command: Callable[[str, str, str], None],
                 on_store_failure: Callable[[], None] = lambda: None,
                 failures: TaskFailures | None = None) -> None:
        """`on_command(op, stream id, reason)`: "cancel" (stop it now),
        "attached" (a reader on another replica: count it for the grace) or
        "left" (that reader is gone: look again now, not at the next poll).
        `on_store_failure()`: the subscription or the alive key failed; it
        runs every POLL_S, so it notices a store outage even when idle.
        `failures`: where an unexpected exception is counted and logged."""
        self._redis = redis
        self._prefix = prefix
        self._channel = control_channel(prefix, replica)
        self._alive = replica_key(prefix, replica)
        # This process, as opposed to a later one under the same replica name.
        self.incarnation = uuid.uuid4().hex
        self._on_command = on_command
        self._on_store_failure = on_store_failure
        self._failures = failures
        self._task: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="resume-control")
        if self._failures is not None:
            self._failures.watch(self._task, "control", self._channel)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(*STORE_ERRORS):
            # Only our own: a successor under the same name may have started.
            if await self._redis.get(self._alive) == self.incarnation:
                await self._redis.delete(self._alive)

    async def send(self, replica: str, op: str, stream_id: str, reason: str = "") -> int:
        """How many subscribers got it: 0 means the owner is not listening."""
        message = json.dumps({"op": op, "id": stream_id, "reason": reason})
        return int(await self._redis.publish(control_channel(self._prefix, replica), message))

    def _handle(self, data: str) -> None:
        try:
            command = json.loads(data)
            if command.get("op") not in ("cancel", "attached", "left"):
                return
            op, stream_id = str(command["op"]), str(command["id"])
            reason = str(command.get("reason") or "cancelled")
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("ignored a malformed control message: %.200r", data)
            return
        try:
            self._on_command(op, stream_id, reason)
        except Exception as exc:  # one command's failure must not stop the channel
            self._caught(f"{op} {stream_id}", exc, "the command is dropped")

    def _caught(self, subject: str, exc: Exception, then: str, repeat: bool = False) -> None:
        if self._failures is not None:
            self._failures.caught("control", subject, exc, then, repeat)
        elif not repeat:
            log.error("resume control task (%s) failed: %r; %s", subject, exc, then,
                      exc_info=exc)

    async def _run(self) -> None:
        backoff = RETRY_FIRST_S
        unexpected = 0  # unexpected failures in a row: the first is logged in full
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                self.subscribed.set()
                while True:
                    # "this replica runs": readers elsewhere end a stream whose
                    # owner stopped saying so (services/gateway/resume/redis_tail.py)
                    await self._redis.set(self._alive, self.incarnation,
                                          px=int(ALIVE_TTL_S * 1000))
                    message = await pubsub.get_message(timeout=POLL_S)
                    # A whole round went through: the next failure starts afresh.
                    backoff, unexpected = RETRY_FIRST_S, 0
                    if message is not None and message.get("type") == "message":
                        self._handle(message["data"])
            except Exception as exc:  # any failure: resubscribed, never the end of the loop
                self.subscribed.clear()
                # Its heartbeat failed either way: while it does, this replica
                # takes no other replica's streams over on a missing alive key.
                self._on_store_failure()
                if isinstance(exc, STORE_ERRORS):
                    log.warning("control channel lost (%s); resubscribing in %.1f s",
                                exc, backoff)
                else:
                    self._caught(self._channel, exc, f"resubscribing in {backoff:.1f} s",
                                 repeat=unexpected > 0)
                    unexpected += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)
            finally:
                try:
                    await asyncio.wait_for(pubsub.aclose(), 1.0)  # type: ignore[no-untyped-call]
                except (*STORE_ERRORS, asyncio.CancelledError):
                    pass
                except Exception as exc:  # the next subscription gets a new connection
                    self._caught(self._channel, exc, "its connection is left to the pool")
