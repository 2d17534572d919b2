"""Every registered check in order, through the check's own hop, as one
Report whose parts are the checks (verdict.py reads them).

Each check runs within its own budget (registry.CheckSpec.budget_s): one that
a server holds past it is ended and reported as an error saying so, and the
others still run. Progress goes to the caller's `progress` (the command prints
it on stderr) as each check starts and ends.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import anyio
import httpx

from streamlab.errors import StreamlabError

# The families, in the order their checks run: importing one registers its checks.
# isort: off
from streamlab.experiments.check import framing, shape, timing  # noqa: F401
from streamlab.experiments.check import heartbeat, cancel, slow_reader  # noqa: F401
from streamlab.experiments.check import resume, concurrency  # noqa: F401
# isort: on
from streamlab.experiments.check.hop import idle_cut_relay, toxiproxy_hop
from streamlab.experiments.check.registry import REGISTRY, Session
from streamlab.experiments.check.target import CheckTarget
from streamlab.experiments.check.verdict import EXPERIMENT, errored, table, verdict
from streamlab.experiments.report import Report
from streamlab.lab.local import find_toxiproxy
from streamlab.lab.target import TargetUnreachable

CHECKS = tuple(REGISTRY)
Progress = Callable[[str], None]


class NoModel(StreamlabError):
    """No --model, and the server's /v1/models names none."""


async def models(target: CheckTarget) -> tuple[list[dict[str, object]], str]:
    """The server's /v1/models entries, or [] and '' when it answers without a
    list, or [] and why it does not answer (any HTTP answer counts as there,
    even a 401 or 404)."""
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            response = await client.get(target.api_url + "/models", headers=target.headers())
    except httpx.HTTPError as exc:
        return [], f"{target.base_url} does not answer: {type(exc).__name__}: {exc}"
    try:
        data = response.json().get("data", [])
    except (ValueError, AttributeError):
        return [], ""
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else [], ""


@contextlib.asynccontextmanager
async def through_hop(target: CheckTarget, run_dir: Path | None = None,
                      progress: Progress | None = None
                      ) -> AsyncIterator[tuple[CheckTarget, str]]:
    """The target as reached through the check's own hop, and which hop: the
    lab's patched Toxiproxy, or, where no toxiproxy-server is installed, a
    plain TCP relay of the check's own on asyncio (no faults can be injected
    through it; the checks themselves need none). An https target goes direct:
    a TCP hop would break its certificate's name."""
    if not target.plain_http:
        yield target, "none (https: checked directly)"
        return
    try:
        binary = find_toxiproxy()
    except FileNotFoundError:
        if progress is not None:
            progress("no toxiproxy-server found (`streamlab install toxiproxy` builds one): "
                     "the check's hop is its own asyncio relay")
        async with idle_cut_relay(target.host, target.port, None) as port:
            yield target.via("127.0.0.1", port), "asyncio relay (no toxiproxy-server found)"
        return
    if progress is not None:
        progress(f"the check's hop: toxiproxy ({binary})")
    with toxiproxy_hop(target.host, target.port, run_dir) as hop:
        yield target.via("127.0.0.1", hop.port), "toxiproxy"


async def run_one(session: Session, name: str) -> Report:
    spec = REGISTRY[name]
    budget = spec.budget_s(session.target)
    try:
        with anyio.fail_after(budget):
            return await spec.run(session)
    except TimeoutError:
        return errored(name, spec.story, f"did not finish within its {budget:g} s budget: the "
                       "server held it (an answer that never ends, a silence past every "
                       "timeout)")
    except (httpx.HTTPError, OSError, StreamlabError) as exc:
        return errored(name, spec.story, f"{type(exc).__name__}: {exc}")


async def run_checks(target: CheckTarget, only: tuple[str, ...] = CHECKS,
                     progress: Progress | None = None) -> Report:
    """Run the checks named in `only` against `target` (already behind the hop,
    or direct); each that raises or overruns is an error part, the others still run."""
    unknown = [name for name in only if name not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown check {unknown[0]!r}; one of {', '.join(CHECKS)}")
    parts: list[Report] = []
    timeout = httpx.Timeout(target.timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=max(16, 2 * target.streams + target.leave_streams))
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        session = Session(client, target)
        for n, name in enumerate(only, 1):
            if progress is not None:
                progress(f"[{n}/{len(only)}] {name} ...")
            began = time.monotonic()
            if session.fatal:
                part = errored(name, REGISTRY[name].story, f"not run: an earlier check met "
                               f"what no check gets past ({session.fatal})")
            else:
                part = await run_one(session, name)
            parts.append(part)
            if progress is not None:
                progress(f"[{n}/{len(only)}] {name}: {verdict(part)} "
                         f"({time.monotonic() - began:.1f} s)")
    return Report(EXPERIMENT, target.base_url, "streaming conformance", parts=tuple(parts),
                  tables=(table(parts),))


def labelled(report: Report, url: str) -> Report:
    """The report under the URL the user gave (the checks ran through the hop's)."""
    return replace(report, variant=url)


async def check_url(target: CheckTarget, only: tuple[str, ...] = CHECKS,
                    run_dir: Path | None = None, progress: Progress | None = None) -> Report:
    """The whole `streamlab check`: is the target there (TargetUnreachable if
    not), which model (the first /v1/models lists, when none is given), does it
    take the lab's knobs, then every check through the hop."""
    listed, why = await models(target)
    if why:
        raise TargetUnreachable(why)
    if not target.model:
        ids = [str(m["id"]) for m in listed if m.get("id")]
        if not ids:
            raise NoModel(f"no --model given, and {target.api_url}/models lists none")
        target = replace(target, model=ids[0])
        if progress is not None:
            progress(f"model {ids[0]} (the first of /v1/models)")
    # A streamlab gateway lists its model as owned by "streamlab".
    if not target.lab_knobs and any(m.get("owned_by") == "streamlab" for m in listed):
        target = replace(target, lab_knobs=True)
    async with through_hop(target, run_dir, progress) as (hopped, hop):
        report = await run_checks(hopped, only, progress)
    report = replace(report, figures={"model": target.model, "hop": hop})
    return labelled(report, target.base_url)
