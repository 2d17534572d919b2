"""A small typed client for Toxiproxy's REST API.

Why not toxiproxy-python (the obvious pick): its last release is from
2019, it keeps the API host in module-global state (so two labs on different
ports cannot be driven from one process, which the test suite does), it has no
timeouts on its HTTP calls, and it has no type hints. The REST API is small
and stable, so a thin client over httpx is less code than a wrapper would be.
The official `toxiproxy-cli` keeps working against the same server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

import httpx

from streamlab.errors import StreamlabError

Direction = Literal["upstream", "downstream"]
DIRECTIONS: tuple[Direction, ...] = get_args(Direction)

# Every toxic type Toxiproxy v2.12 has, with its attributes (all integers) and
# what each one means. The CLI validates against this before calling the API,
# because Toxiproxy silently ignores attribute names it does not know.
TOXIC_TYPES: dict[str, dict[str, str]] = {
    "latency": {"latency": "ms added to every chunk", "jitter": "± ms, random per chunk"},
    "bandwidth": {"rate": "KB/s at most"},
    "slow_close": {"delay": "ms to wait before passing a close on"},
    "timeout": {"timeout": "ms until the connection is closed; 0 = black hole, never closed"},
    "reset_peer": {"timeout": "ms until a TCP RST, counted from the next chunk"},
    "slicer": {"average_size": "bytes per slice", "size_variation": "± bytes",
               "delay": "µs between slices"},
    "limit_data": {"bytes": "bytes passed before the connection is closed"},
}


class ToxiproxyError(StreamlabError):
    """Toxiproxy refused an operation (status_code > 0) or could not be reached (0)."""

    def __init__(self, status_code: int, message: str) -> None:
        where = f"answered {status_code}" if status_code else "unreachable"
        super().__init__(f"toxiproxy {where}: {message}")
        self.status_code = status_code


class ToxicSpecError(StreamlabError, ValueError):
    """A toxic's type or attributes are not what Toxiproxy understands."""


def parse_attributes(toxic_type: str, pairs: list[str]) -> dict[str, int]:
    """`["latency=500", "jitter=50"]` → `{"latency": 500, "jitter": 50}`, checked
    against the type's known attributes."""
    known = TOXIC_TYPES.get(toxic_type)
    if known is None:
        raise ToxicSpecError(
            f"unknown toxic type {toxic_type!r}; one of: {', '.join(TOXIC_TYPES)}")
    attributes: dict[str, int] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ToxicSpecError(f"attribute {pair!r} is not key=value")
        if key not in known:
            raise ToxicSpecError(
                f"{toxic_type} has no attribute {key!r}; it has: {', '.join(known)}")
        try:
            attributes[key] = int(value)
        except ValueError as exc:
            raise ToxicSpecError(f"attribute {key}={value!r} is not an integer") from exc
        if attributes[key] < 0:
            raise ToxicSpecError(f"attribute {key}={value} must not be negative")
    return attributes


@dataclass(frozen=True)
class ProxySpec:
    name: str
    listen: str
    upstream: str
    enabled: bool = True

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "listen": self.listen, "upstream": self.upstream,
                "enabled": self.enabled}


@dataclass(frozen=True)
class Toxic:
    """One toxic, named after Toxiproxy's own types (latency, bandwidth, slow_close,
    timeout, reset_peer, slicer, limit_data)."""

    type: str
    attributes: dict[str, int | float] = field(default_factory=dict)
    stream: Direction = "downstream"
    toxicity: float = 1.0
    name: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name or f"{self.type}_{self.stream}", "type": self.type,
                "stream": self.stream, "toxicity": self.toxicity,
                "attributes": self.attributes}


class ToxiproxyClient(Protocol):
    """What the lab tool asks of Toxiproxy, by hop name: `Toxiproxy` below speaks it
    to the real server, `FakeToxiproxy` (streamlab/lab/fake.py) records it for unit
    tests. A target's `toxiproxy()` returns one; use it as a context manager."""

    def close(self) -> None: ...

    def __enter__(self) -> ToxiproxyClient: ...

    def __exit__(self, *exc_info: object) -> None: ...

    def proxies(self) -> dict[str, dict[str, Any]]: ...

    def reset(self) -> None: ...

    def proxy(self, name: str) -> dict[str, Any]: ...

    def set_enabled(self, proxy: str, enabled: bool) -> None: ...

    def set_upstream(self, proxy: str, upstream: str) -> None: ...

    def toxics(self, proxy: str) -> list[dict[str, Any]]: ...

    def add_toxic(self, proxy: str, toxic: Toxic) -> dict[str, Any]: ...

    def update_toxic(self, proxy: str, name: str, attributes: dict[str, int | float],
                     toxicity: float | None = None) -> dict[str, Any]: ...

    def remove_toxic(self, proxy: str, name: str) -> None: ...

    def metrics(self) -> str: ...


class _Api:
    """One Toxiproxy process's REST API."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self._base_url = base_url
        self._timeout_s = timeout_s
        self._http: httpx.Client | None = None

    @property
    def http(self) -> httpx.Client:
        # Made on first use: a client loads a CA bundle as it is made (tens of ms,
        # hundreds on a loaded machine), and most calls need one process's API
        # only. A toxic added mid-stream must land while the stream still runs.
        if self._http is None:
            self._http = httpx.Client(base_url=self._base_url, timeout=self._timeout_s)
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()

    def call(self, method: str, path: str, json: Any = None) -> Any:
        try:
            response = self.http.request(method, path, json=json)
        except httpx.HTTPError as exc:
            raise ToxiproxyError(0, f"{self.http.base_url}: {exc!r}") from exc
        if response.status_code >= 400:
            try:
                message = response.json().get("error", response.text)
            except ValueError:
                message = response.text
            raise ToxiproxyError(response.status_code, str(message))
        if response.status_code == 204 or not response.content:
            return None
        if "json" in response.headers.get("content-type", ""):
            return response.json()
        return response.text


class Toxiproxy:
    """The lab's hops by name, whichever Toxiproxy process serves each.

    The lab runs more than one Toxiproxy process (a process holds two sockets per
    stream per HTTP hop, and the file limit caps it: streamlab/lab/topology.py), so
    `routes` maps a proxy name to the API of the process that serves it; every
    other name goes to `base_url`. Callers name hops and never need to know which
    process holds one: the whole-lab calls (proxies, reset, metrics) go to every
    process and merge the answers.
    """

    def __init__(self, base_url: str, timeout_s: float = 5.0,
                 routes: Mapping[str, str] | None = None) -> None:
        self._default = _Api(base_url, timeout_s)
        self._apis = {base_url: self._default}
        self._routes: dict[str, _Api] = {}
        for proxy, url in (routes or {}).items():
            self._routes[proxy] = self._apis.setdefault(url, _Api(url, timeout_s))

    def close(self) -> None:
        for api in self._apis.values():
            api.close()

    def __enter__(self) -> Toxiproxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, method: str, path: str, json: Any = None) -> Any:
        """A call about one proxy (`/proxies/NAME...`) goes to the process serving it."""
        parts = path.split("/")
        api = self._routes.get(parts[2], self._default) if len(parts) > 2 else self._default
        return api.call(method, path, json)

    def _each(self, method: str, path: str) -> list[Any]:
        return [api.call(method, path) for api in self._apis.values()]

    def proxies(self) -> dict[str, dict[str, Any]]:
        """Every proxy of every process, by name."""
        result: dict[str, dict[str, Any]] = {}
        for answer in self._each("GET", "/proxies"):
            result.update(answer)
        return result

    def reset(self) -> None:
        """Enable every proxy and remove every toxic, in every process."""
        self._each("POST", "/reset")

    def proxy(self, name: str) -> dict[str, Any]:
        """One proxy with its toxics (`enabled`, `listen`, `upstream`, `toxics`)."""
        result: dict[str, Any] = self._call("GET", f"/proxies/{name}")
        return result

    def set_enabled(self, proxy: str, enabled: bool) -> None:
        """Disabling closes every open connection of the proxy and refuses new
        ones: a deterministic cut in the middle of a stream."""
        self._call("POST", f"/proxies/{proxy}", {"enabled": enabled})

    def set_upstream(self, proxy: str, upstream: str) -> None:
        """Point the proxy at another host:port; Toxiproxy restarts its listener,
        so its open connections close (the pytest plugin's idle cut uses it)."""
        self._call("POST", f"/proxies/{proxy}", {"upstream": upstream})

    def toxics(self, proxy: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", f"/proxies/{proxy}/toxics")
        return result

    def add_toxic(self, proxy: str, toxic: Toxic) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/proxies/{proxy}/toxics", toxic.as_json())
        return result

    def update_toxic(self, proxy: str, name: str, attributes: dict[str, int | float],
                     toxicity: float | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"attributes": attributes}
        if toxicity is not None:
            body["toxicity"] = toxicity
        result: dict[str, Any] = self._call("POST", f"/proxies/{proxy}/toxics/{name}", body)
        return result

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")

    def metrics(self) -> str:
        """Prometheus text from `-proxy-metrics` (bytes per proxy and direction), every
        process's in turn (each proxy is labelled with its name)."""
        return "".join(str(answer) for answer in self._each("GET", "/metrics"))
