"""The target's own metrics: a Prometheus text exposition, read with
prometheus_client's parser (labels, timestamps and escapes read right), and
the gauge of generations running now that the cancel and slow-reader checks
watch.

Found, not asked for: `--metrics-url` when given, else the server's root
`/metrics` (vLLM, SGLang, TGI and llama.cpp's server serve it there), checked
for a known running gauge (target.KNOWN_RUNNING_GAUGES) or `--running-gauge`.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from streamlab.experiments.check.target import KNOWN_RUNNING_GAUGES, CheckTarget

# A real server's exposition is tens of KB; a body past this is not one.
MAX_METRICS_BYTES = 4 << 20


def _families(text: str) -> dict[str, float]:
    """Each metric family's samples summed over every label set (a gauge per
    model, per engine, per data-parallel rank is still one figure)."""
    totals: dict[str, float] = {}

    def add(chunk: str) -> None:
        for family in text_string_to_metric_families(chunk):
            for sample in family.samples:
                # A gauge's sample has the family's name; counters add `_total`
                # and histograms their `_bucket`s, which are not running gauges.
                if sample.name == family.name:
                    totals[family.name] = totals.get(family.name, 0.0) + sample.value

    try:
        add(text)
    except ValueError:
        # One line the parser refuses would lose the whole exposition: read
        # the samples one line at a time and keep every one that parses.
        totals.clear()
        for raw in text.splitlines():
            if raw and not raw.startswith("#"):
                try:
                    add(raw + "\n")
                except ValueError:
                    continue
    return totals


def gauge(text: str, name: str) -> float | None:
    """The sum of a metric's samples (every label set), or None when it is not there."""
    return _families(text).get(name)


@dataclass(frozen=True)
class RunningGauge:
    url: str  # the /metrics it is read from
    name: str  # the gauge's name
    found: bool  # found at the server's root (not given with --metrics-url)


async def fetch(client: httpx.AsyncClient, url: str) -> str | None:
    """The exposition's text, or None when it did not answer with one."""
    try:
        async with client.stream("GET", url, timeout=10.0) as response:
            if not response.is_success:
                return None
            body = b""
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_METRICS_BYTES:
                    return None
    except httpx.HTTPError:
        return None
    return body.decode(errors="replace")


async def read_gauge(client: httpx.AsyncClient, source: RunningGauge) -> float | None:
    text = await fetch(client, source.url)
    return None if text is None else gauge(text, source.name)


async def find_running_gauge(client: httpx.AsyncClient, target: CheckTarget
                             ) -> tuple[RunningGauge | None, str]:
    """The running gauge to watch, or None and why none was found (a reason a
    user can act on: which URL answered what, which names were looked for)."""
    names = ([target.running_gauge] if target.running_gauge else []) + list(KNOWN_RUNNING_GAUGES)
    url = target.metrics_url or target.root_url + "/metrics"
    text = await fetch(client, url)
    where = "--metrics-url" if target.metrics_url else "the server's root"
    if text is None:
        return None, f"no metrics: {url} ({where}) gave no Prometheus text; give --metrics-url"
    totals = _families(text)
    for name in names:
        if name in totals:
            return RunningGauge(url, name, found=target.metrics_url is None), ""
    return None, (f"no running gauge in {url} (looked for {', '.join(names)}); "
                  "name yours with --running-gauge")
