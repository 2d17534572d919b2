"""A small typed client for Toxiproxy's REST API.

Why not toxiproxy-python (the design card's pick): its last release is from
2019, it keeps the API host in module-global state (so two labs on different
ports cannot be driven from one process, which the test suite does), it has no
timeouts on its HTTP calls, and it has no type hints. The REST API is small
and stable, so a thin client over httpx is less code than a wrapper would be.
The official `toxiproxy-cli` keeps working against the same server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

Direction = Literal["upstream", "downstream"]


class ToxiproxyError(Exception):
    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"toxiproxy answered {status_code}: {message}")
        self.status_code = status_code


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


class Toxiproxy:
    def __init__(self, base_url: str, timeout_s: float = 5.0) -> None:
        self._http = httpx.Client(base_url=base_url, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, json: Any = None) -> Any:
        response = self._http.request(method, path, json=json)
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

    def version(self) -> str:
        return str(self._call("GET", "/version")).strip()

    def proxies(self) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = self._call("GET", "/proxies")
        return result

    def populate(self, specs: list[ProxySpec]) -> None:
        self._call("POST", "/populate", [s.as_json() for s in specs])

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self._call("POST", "/reset")

    def set_enabled(self, proxy: str, enabled: bool) -> None:
        self._call("POST", f"/proxies/{proxy}", {"enabled": enabled})

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
        """Prometheus text from `-proxy-metrics` (bytes per proxy and direction)."""
        return str(self._call("GET", "/metrics"))
