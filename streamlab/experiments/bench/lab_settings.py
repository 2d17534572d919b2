"""A local lab's services restarted on the settings a bench needs, and put back.

    lab_settings(lab, largest)   the gateway's and the engine's stream caps raised
                                 for `largest` streams; yields `use_clock(clock)`,
                                 which restarts the engine on that clock when it
                                 changes; every setting put back at the end

Shared by bench scale's cells and `bench cancel --background`: it changes the
lab's own env overrides (`lab.options`) and restarts the services, so it needs
a lab this tool started (`streamlab up`); any other is MissingCapability.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from streamlab.lab.target import LabTarget, MissingCapability


@contextlib.contextmanager
def lab_settings(lab: LabTarget, largest: int) -> Iterator[Callable[[str], None]]:
    """Raise the caps for `largest` streams; yield a function that puts the engine
    on a clock (restarting it when it changes); restore everything at the end."""
    from streamlab.lab.local import Lab

    if not isinstance(lab, Lab):
        raise MissingCapability("pids", "bench scale restarts the engine to switch clocks")
    engine_env, gateway_env = lab.options.engine_env, lab.options.gateway_env
    saved = dict(engine_env), dict(gateway_env)
    caps = str(largest + 16)
    wanted_gateway = {"STREAMLAB_GATEWAY_MAX_STREAMS": caps,
                      "STREAMLAB_GATEWAY_MAX_STREAMS_PER_CLIENT": caps}
    wanted_engine = {"STREAMLAB_ENGINE_MAX_RUNNING_GENERATIONS": caps,
                     "STREAMLAB_ENGINE_MAX_QUEUED_GENERATIONS": caps}
    try:
        if any(gateway_env.get(k) != v for k, v in wanted_gateway.items()):
            gateway_env.update(wanted_gateway)
            lab.stop_service("gateway")
            lab.start_service("gateway")
        engine_env.update(wanted_engine)
        current: list[str | None] = [None]

        def use_clock(clock: str) -> None:
            if current[0] == clock:
                return
            engine_env["STREAMLAB_FAKE_CLOCK"] = clock
            lab.stop_service("engine")
            lab.start_service("engine")
            current[0] = clock

        yield use_clock
    finally:
        changed_gateway = gateway_env != saved[1]
        engine_env.clear()
        engine_env.update(saved[0])
        gateway_env.clear()
        gateway_env.update(saved[1])
        lab.stop_service("engine")
        lab.start_service("engine")
        if changed_gateway:
            lab.stop_service("gateway")
            lab.start_service("gateway")
