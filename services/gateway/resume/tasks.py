"""The resume path's background tasks must not die silently.

A task that dies of an exception nobody handles says nothing (asyncio logs
"Task exception was never retrieved" only when the task is collected, which a
task still referenced never is), and what it was doing stops for good: the
owner's log writer that a Redis restart killed left its stream `running` in
Redis while the owner finished it, and readers on other replicas waited on
pings. So each of these tasks catches any Exception (never a cancel), counts
it here, logs it once, and carries on in a way another replica can act on
(each task's module says how). Store errors are not counted here: they are
expected while Redis is down and have their own counters
(`streamlab_gateway_resume_store_*`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger("streamlab.gateway")

# The resume path's background work, as `task` of
# streamlab_gateway_resume_task_failures_total. Every store: a stream's
# producer (it reads the engine call into the log). The shared store
# (services/gateway/resume/redis_*.py): the owner's log writer; the control
# channel (commands from other replicas, and this replica's alive key); the
# shared record's reader-left, attach and presence writes (record.py); a
# remote reader's presence in `followers` and its live tail (redis_tail.py);
# the owner's grace check; the take-over sweep and a take-over; the list of
# the streams this replica owns (the sweep's, once it is gone).
RESUME_TASKS = ("producer", "log_writer", "control", "reader_left", "reader_attach",
                "reader_attempt", "readers_presence", "presence", "tail", "grace_check",
                "takeover", "owned_list")


class TaskFailures:
    """Exceptions the resume path's background tasks caught that are not store
    errors (those have their own counters and are expected while Redis is
    down): each one is counted here and logged once, and the task carries on
    (each says how) instead of dying with it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counter = Counter("streamlab_gateway_resume_task_failures",
                               "Unexpected exceptions (not store errors) caught by the "
                               "resume path's background tasks, which carried on", ["task"],
                               registry=registry)
        for task in RESUME_TASKS:
            self.counter.labels(task)

    def caught(self, task: str, subject: str, exc: BaseException, then: str,
               repeat: bool = False) -> None:
        """`subject`: the stream (or what the task works on); `then`: what the
        task does now. `repeat`: the same task failed just before, and that
        was logged: counted only (a loop that retries every few seconds must
        not fill the log; its counter says how often)."""
        self.counter.labels(task).inc()
        if repeat:
            log.debug("resume %s task (%s) failed again: %r; %s", task, subject, exc, then)
        else:
            log.error("resume %s task (%s) failed: %r; %s", task, subject, exc, then,
                      exc_info=exc)

    def watch(self, task: asyncio.Task[Any], name: str, subject: str) -> None:
        """A task's last resort: an exception that escaped it anyway is
        retrieved, logged and counted when it ends (never "Task exception was
        never retrieved", seen only when the task is collected, if ever)."""
        def done(finished: asyncio.Task[Any]) -> None:
            if not finished.cancelled() and (exc := finished.exception()) is not None:
                self.caught(name, subject, exc, "the task ended")

        task.add_done_callback(done)
