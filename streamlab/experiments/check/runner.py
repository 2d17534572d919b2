"""Every check family in order, through the check's own Toxiproxy hop, as one
Report whose parts are the checks (verdict.py reads them)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx

from streamlab.errors import StreamlabError
from streamlab.experiments.check import (
    cancel,
    concurrency,
    framing,
    heartbeat,
    resume,
    slow_reader,
    timing,
)
from streamlab.experiments.check.hop import Hop, toxiproxy_hop
from streamlab.experiments.check.target import CheckTarget
from streamlab.experiments.check.verdict import EXPERIMENT, errored, table
from streamlab.experiments.report import Report
from streamlab.lab.target import TargetUnreachable

CHECKS = ("framing", "errors", "first-byte", "heartbeat", "idle-cut", "cancel", "slow-reader",
          "resume", "concurrency")


async def probe(target: CheckTarget) -> str:
    """Whether the server answers: '' when it does, else why not (any HTTP answer
    counts, even a 401 or 404: the server is there)."""
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            await client.get(target.base_url.rstrip("/") + "/models", headers=target.headers())
    except httpx.HTTPError as exc:
        return f"{target.base_url} does not answer: {type(exc).__name__}: {exc}"
    return ""


async def takes_lab_knobs(target: CheckTarget) -> bool:
    """A streamlab gateway lists its model as owned by "streamlab"."""
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            response = await client.get(target.base_url.rstrip("/") + "/models",
                                        headers=target.headers())
            models = response.json().get("data", [])
    except (httpx.HTTPError, ValueError, AttributeError):
        return False
    return any(isinstance(m, dict) and m.get("owned_by") == "streamlab" for m in models)


@contextlib.contextmanager
def through_hop(target: CheckTarget, run_dir: Path | None = None
                ) -> Iterator[tuple[CheckTarget, Hop | None]]:
    """The target as reached through the check's own Toxiproxy (an https target
    goes direct: a TCP hop would break its certificate's name)."""
    if not target.plain_http:
        yield target, None
        return
    with toxiproxy_hop(target.host, target.port, run_dir) as hop:
        yield target.via("127.0.0.1", hop.port), hop


async def run_checks(target: CheckTarget, only: tuple[str, ...] = CHECKS) -> Report:
    """Run the checks named in `only` against `target` (already behind the hop,
    or direct); each that raises is an error part, the others still run."""
    parts: list[Report] = []
    timeout = httpx.Timeout(target.timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=max(16, 2 * target.streams))
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        direct_silence = None
        for name in only:
            try:
                if name == "framing":
                    parts.append(await framing.stream_framing(client, target))
                elif name == "errors":
                    parts.append(await framing.error_framing(client, target))
                elif name == "first-byte":
                    parts.append(await timing.first_byte(client, target))
                elif name == "heartbeat":
                    part, direct_silence = await heartbeat.heartbeat(client, target)
                    parts.append(part)
                elif name == "idle-cut":
                    if direct_silence is None:
                        _, direct_silence = await heartbeat.heartbeat(client, target)
                    parts.append(await heartbeat.idle_cut(client, target, direct_silence))
                elif name == "cancel":
                    parts.append(await cancel.client_leaves(client, target))
                elif name == "slow-reader":
                    parts.append(await slow_reader.slow_reader(client, target))
                elif name == "resume":
                    parts.append(await resume.resume(client, target))
                elif name == "concurrency":
                    parts.append(await concurrency.cadence(client, target))
                else:
                    raise ValueError(f"unknown check {name!r}; one of {', '.join(CHECKS)}")
            except (httpx.HTTPError, OSError, StreamlabError) as exc:
                parts.append(errored(name, "", f"{type(exc).__name__}: {exc}"))
    return Report(EXPERIMENT, target.base_url, "streaming conformance", parts=tuple(parts),
                  tables=(table(parts),))


def labelled(report: Report, url: str) -> Report:
    """The report under the URL the user gave (the checks ran through the hop's)."""
    return replace(report, variant=url)


async def check_url(target: CheckTarget, only: tuple[str, ...] = CHECKS,
                    run_dir: Path | None = None) -> Report:
    """The whole `streamlab check`: is the target there (TargetUnreachable if
    not), does it take the lab's knobs, then every check through the hop."""
    why = await probe(target)
    if why:
        raise TargetUnreachable(why)
    if not target.lab_knobs and await takes_lab_knobs(target):
        target = replace(target, lab_knobs=True)
    with through_hop(target, run_dir) as (hopped, _hop):
        report = await run_checks(hopped, only)
    return labelled(report, target.base_url)
