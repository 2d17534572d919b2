"""A watchdog for the lab's Toxiproxy processes: it notices an API that no
longer answers, restarts that process (its proxies come back from its -config
file), puts back the toxics it held when last seen healthy, and says so.

    health      ok       /version and /proxies answer
                wedged   /version answers, /proxies does not (in time): a
                         proxy's lock is held by a toxic change that waits on
                         a blocked link (upstream report "control port
                         hangs on removing a toxic")
                down     /version does not answer either (killed, stopped)

The lab's Toxiproxy is built with a patch against the known wedge
(scripts/build_toxiproxy.sh); this is the second line. A build without the
patch, or a wedge nobody has found yet, costs one restart and a line in the
run's report instead of every run after it ("toxiproxy unreachable" until the
lab is restarted by hand).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import httpx

from streamlab.lab.target import Capability, LabTarget
from streamlab.lab.topology import TOXIPROXY_PROCESSES, toxiproxy_api_port
from streamlab.lab.toxiproxy import ToxiproxyError

Health = Literal["ok", "wedged", "down"]
ToxicJson = dict[str, object]
# A healthy API answers in milliseconds; the wedged one never does (its own
# handler timeout answers 503 after 25 s).
PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Probe:
    health: Health
    toxics: Mapping[str, tuple[ToxicJson, ...]] = field(default_factory=dict)  # hop → toxics


def probe(api_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """One Toxiproxy process's health, and its toxics when it answers."""
    try:
        if httpx.get(f"{api_url}/version", timeout=timeout_s).status_code != 200:
            return Probe("down")
    except httpx.HTTPError:
        return Probe("down")
    try:
        answer = httpx.get(f"{api_url}/proxies", timeout=timeout_s)
    except httpx.TimeoutException:
        return Probe("wedged")
    except httpx.HTTPError:
        return Probe("down")
    if answer.status_code != 200:
        return Probe("wedged")  # the API's handler timeout: 503
    proxies: dict[str, dict[str, object]] = answer.json()
    return Probe("ok", {hop: tuple(_toxics(proxy)) for hop, proxy in proxies.items()})


def _toxics(proxy: Mapping[str, object]) -> list[ToxicJson]:
    toxics = proxy.get("toxics")
    return [t for t in toxics if isinstance(t, dict)] if isinstance(toxics, list) else []


@dataclass(frozen=True)
class Restart:
    process: str
    health: Health  # what it was found in
    toxics_restored: int
    took_s: float

    def describe(self) -> str:
        return (f"{self.process} was {self.health}: restarted with its proxies and "
                f"{self.toxics_restored} toxic(s) in {self.took_s:.1f} s")


class ToxiproxyWatchdog:
    """Checks every Toxiproxy process of a lab; remembers each healthy one's
    toxics, so a restart can put them back."""

    def __init__(self, lab: LabTarget, *, timeout_s: float = PROBE_TIMEOUT_S,
                 probe_api: Callable[[str, float], Probe] = probe) -> None:
        self.lab = lab
        self.timeout_s = timeout_s
        self._probe = probe_api
        self._last_toxics: dict[str, Mapping[str, tuple[ToxicJson, ...]]] = {}
        self.restarts: list[Restart] = []

    def api_urls(self) -> dict[str, str]:
        ports = self.lab.ports
        return {process: f"http://{ports.host}:{toxiproxy_api_port(ports, process)}"
                for process in TOXIPROXY_PROCESSES}

    def check(self) -> list[Restart]:
        """Probe each process; restart the ones that do not answer. Raises
        ToxiproxyError if one is wedged or down on a lab that cannot restart it."""
        done = []
        for process, url in self.api_urls().items():
            found = self._probe(url, self.timeout_s)
            if found.health == "ok":
                self._last_toxics[process] = found.toxics
                continue
            if Capability.RESTART_SERVICE not in self.lab.capabilities:
                raise ToxiproxyError(0, f"{process} at {url} is {found.health}, and this lab "
                                        "cannot restart it: restart the lab")
            done.append(self._restart(process, url, found.health))
        self.restarts += done
        return done

    def _restart(self, process: str, url: str, health: Health) -> Restart:
        started = time.monotonic()
        self.lab.kill_service(process)  # SIGKILL: a wedged process will not stop by asking
        self.lab.start_service(process)  # its -config brings the proxies back
        restored = 0
        with httpx.Client(base_url=url, timeout=5.0) as api:
            for hop, toxics in self._last_toxics.get(process, {}).items():
                for toxic in toxics:
                    api.post(f"/proxies/{hop}/toxics", json=toxic).raise_for_status()
                    restored += 1
        return Restart(process, health, restored, time.monotonic() - started)
