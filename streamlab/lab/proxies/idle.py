"""Which idle timeouts of a proxy config cut a silent stream.

A stream is silent while the model pauses (prefill, thinking, a tool call):
a proxy's idle timeout shorter than that pause cuts it, unless the gateway's
heartbeats come more often. This reads the timeout directives of a config,
with the lab's placeholders filled in, so a report can name the line to change.
The directives themselves are each proxy's (EdgeProxy.idle_directives).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from streamlab.lab.proxies import PROXIES

_UNITS_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0,
            "ns": 1e-9}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|ns|s|m|h|d)?")
_PLACEHOLDER = re.compile(
    r"\$\{(STREAMLAB_\w+)\}|\{\$(STREAMLAB_\w+)\}|\{\{\s*env\s+\"(STREAMLAB_\w+)\"\s*\}\}")


@dataclass(frozen=True)
class IdleTimeout:
    directive: str
    seconds: float
    line: int  # 1-based, in the config file

    def describe(self) -> str:
        return f"`{self.directive}` {self.seconds:g} s (line {self.line})"


def fill(text: str, values: dict[str, str]) -> str:
    """The config as the proxy reads it: each placeholder style (HAProxy's
    `${X}`, Caddy's `{$X}`, Traefik's `{{ env "X" }}`) replaced by its value."""
    def value(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        return values.get(name, match.group(0))

    return _PLACEHOLDER.sub(value, text)


def parse_duration(text: str, bare_unit: str) -> float | None:
    """`2s`, `1500ms`, `1m30s` (Go), a bare `30` in the proxy's own unit."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNITS_S[u or bare_unit] for n, u in parts)


def idle_timeouts(proxy: str, text: str) -> list[IdleTimeout]:
    """Every idle-timeout directive in a (filled-in) config, in file order."""
    found: list[IdleTimeout] = []
    known = PROXIES.get(proxy)  # a proxy the lab does not know has none it can read
    for directive, unit, pattern in known.idle_directives if known else ():
        for match in pattern.finditer(text):
            seconds = parse_duration(match.group(2), unit)
            if seconds is not None and seconds > 0:
                found.append(IdleTimeout(directive, seconds,
                                         text.count("\n", 0, match.start(1)) + 1))
    return sorted(found, key=lambda t: t.line)


def cuts_streams(proxy: str, text: str, silence_s: float) -> list[IdleTimeout]:
    """The directives that cut a stream silent for `silence_s` (a model's
    pause without heartbeats, or the gap between two heartbeats)."""
    return [t for t in idle_timeouts(proxy, text) if t.seconds < silence_s]
