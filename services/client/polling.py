"""Measuring clients for short and long polling (services/gateway/polling_routes.py).

Short polling asks on a fixed timetable (start + k x interval, not "interval
after the last answer"), so its lateness is the interval's and not the
server's. Long polling asks again the moment an answer lands.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from services.client.transport_run import TransportRun


def _answer(response: httpx.Response, run: TransportRun, expected: int,
            step: str) -> dict[str, Any] | None:
    """Count the request and what came back; the JSON answer, or None with the
    run's error set when the status is not the expected one."""
    run.requests += 1
    run.payload_bytes_down += len(response.content)
    if response.status_code != expected:
        run.error = f"{step}: HTTP {response.status_code}: {response.text[:200]}"
        return None
    answer: dict[str, Any] = response.json()
    return answer


async def _start(client: httpx.AsyncClient, base_url: str, body: dict[str, Any],
                 run: TransportRun) -> str | None:
    answer = _answer(await client.post(f"{base_url}/v1/jobs", json=body), run, 201, "start")
    return None if answer is None else str(answer["id"])


async def _poll(client: httpx.AsyncClient, base_url: str, job_id: str, since: int,
                run: TransportRun, wait_s: float = 0.0) -> dict[str, Any] | None:
    params: dict[str, str | int | float] = {"since": since}
    if wait_s:
        params["wait_s"] = wait_s
    answer = _answer(await client.get(f"{base_url}/v1/jobs/{job_id}", params=params), run,
                     200, "poll")
    if answer is None:
        return None
    run.tokens(answer["tokens"])
    if answer.get("error"):
        run.error = f"job failed: {answer['error']}"
        return None
    return answer


async def _follow(client: httpx.AsyncClient, base_url: str, body: dict[str, Any],
                  run: TransportRun, *, interval_s: float | None, wait_s: float
                  ) -> TransportRun:
    """Start a job and poll it to the end: on a timetable (`interval_s`), or
    again as soon as each answer lands (None)."""
    try:
        job_id = await _start(client, base_url, body, run)
        since, tick = 0, 0
        while job_id is not None:
            if interval_s is not None:
                tick += 1
                await asyncio.sleep(max(0.0, tick * interval_s - run.elapsed()))
            answer = await _poll(client, base_url, job_id, since, run, wait_s=wait_s)
            if answer is None:
                break
            since = answer["next"]
            if answer["done"]:
                run.done = True
                break
    except httpx.HTTPError as exc:
        run.error = f"{type(exc).__name__}: {exc}"
    return run.finish()


async def short_poll(client: httpx.AsyncClient, base_url: str, body: dict[str, Any],
                     interval_s: float) -> TransportRun:
    return await _follow(client, base_url, body, TransportRun(f"poll {interval_s * 1000:g} ms"),
                         interval_s=interval_s, wait_s=0.0)


async def long_poll(client: httpx.AsyncClient, base_url: str, body: dict[str, Any],
                    wait_s: float = 30.0) -> TransportRun:
    """The client's read timeout must exceed wait_s (the server holds that long)."""
    return await _follow(client, base_url, body, TransportRun("long poll"),
                         interval_s=None, wait_s=wait_s)
