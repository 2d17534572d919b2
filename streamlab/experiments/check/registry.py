"""Every check of `streamlab check`, registered once: its name, its story, the
figures its row shows, how long it may take, and the coroutine that runs it.

A check is one function in its family's module, decorated with `@check(...)`;
the runner, the command's `--only`, the table's figures, the JUnit and the
pytest plugin all read REGISTRY, so a new check touches nothing else. The
order of the registry is the order of the run (runner.py imports the families
in order).

A check receives the Session: the shared HTTP client, the target, and
measurements one check makes and another reuses (the silence probe that both
heartbeat and idle-cut judge, the running gauge found once).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from services.client.openai_stream import StreamResult, stream_chat
from streamlab.experiments.check.target import CheckTarget
from streamlab.experiments.report import JSON, Report


@dataclass
class Session:
    client: httpx.AsyncClient
    target: CheckTarget
    # What a stream met that no later check could get past (an answer that never
    # ends, a line that never does, no headers at all): the checks after it are
    # not run, so a hostile server costs one stream deadline, not one a check.
    fatal: str = ""
    _memo: dict[str, Any] = field(default_factory=dict)
    _locks: dict[str, anyio.Lock] = field(default_factory=dict)

    async def once(self, key: str, make: Callable[[], Awaitable[Any]]) -> Any:
        """`make()`'s result, made once per run and shared by every check that asks."""
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            if key not in self._memo:
                self._memo[key] = await make()
        return self._memo[key]

    async def stream(self, body: dict[str, JSON], *, target: CheckTarget | None = None,
                     client: httpx.AsyncClient | None = None, deadline_s: float | None = None,
                     **options: Any) -> StreamResult:
        """One streamed chat request, read by the project's measuring client
        within the target's stream deadline (or a shorter one of the check's,
        which is then no sign of an answer that never ends)."""
        target = target or self.target
        record = await stream_chat(client or self.client, target.chat_url, body,
                                   headers=target.headers(),
                                   deadline_s=deadline_s or target.stream_deadline_s, **options)
        code = (record.error or {}).get("code")
        if deadline_s is not None and code == "deadline":
            return record
        if not self.fatal and code in ("deadline", "oversized_event"):
            self.fatal = record.error_text
        elif not self.fatal and code == "timeout" and record.headers_s is None:
            self.fatal = (f"no response headers within the {target.timeout_s:g} s read "
                          "timeout: the server took the request and never answered")
        return record


Run = Callable[[Session], Awaitable[Report]]


@dataclass(frozen=True)
class CheckSpec:
    name: str
    story: str
    headline: tuple[str, ...]  # the figures its table row shows (all are in --json)
    run: Run
    # The most this check may take on `target` before it is ended as an error,
    # said in the verdict: a hostile server cannot hold the run.
    budget_s: Callable[[CheckTarget], float]


REGISTRY: dict[str, CheckSpec] = {}


def check(name: str, story: str, *, headline: tuple[str, ...],
          budget_s: Callable[[CheckTarget], float]) -> Callable[[Run], Run]:
    def register(run: Run) -> Run:
        if name in REGISTRY:
            raise ValueError(f"check {name!r} is registered twice")
        REGISTRY[name] = CheckSpec(name, story, headline, run, budget_s)
        return run
    return register


def streams_budget(count: int = 1) -> Callable[[CheckTarget], float]:
    """`count` streams one after another, each within the stream deadline."""
    return lambda target: count * target.stream_deadline_s + 10.0
