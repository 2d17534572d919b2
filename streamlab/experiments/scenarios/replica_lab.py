"""A private replica lab for the scenarios that need one (reconnect-storm,
store-faults, rolling-deploy, replica-loss): `make up` starts 1 gateway, 1
engine and no Redis, and those scenarios need several gateways (sharing Redis,
or each with its own memory store), and gateway settings of their own per mode
(a gateway setting cannot change under a running lab).

So such a scenario starts its own lab beside the one that is up, on free
ports, with the lab's nginx options and service settings plus its own, and
stops it after the run, saying so on stderr. It needs the local-process lab
(`streamlab up`) and redis-server; without them it raises ScenarioUnavailable,
which `scenario run all` shows as skipped.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from streamlab.experiments.scenarios.model import ScenarioUnavailable
from streamlab.lab.local import Lab, LabOptions, find_redis
from streamlab.lab.processes import StartError
from streamlab.lab.spare_ports import free_lab_ports
from streamlab.lab.target import LabTarget
from streamlab.lab.topology import Ports

# Enough engine slots and per-client streams for hundreds of streams from one
# client address (the suite's lab has small caps, on purpose, for its limit tests).
SCALE_ENGINE_ENV = {"STREAMLAB_ENGINE_MAX_RUNNING_GENERATIONS": "8192",
                    "STREAMLAB_ENGINE_MAX_QUEUED_GENERATIONS": "1024"}
SCALE_GATEWAY_ENV = {"STREAMLAB_GATEWAY_MAX_STREAMS": "8192",
                     "STREAMLAB_GATEWAY_MAX_STREAMS_PER_CLIENT": "8192",
                     "STREAMLAB_GATEWAY_RESUME_MAX_STREAMS": "8192"}

# The running lab's wiring, not its behaviour: where it listens, what it dials,
# which store it uses. A lab started from a shell with STREAMLAB_*_PORT set
# records those in its settings (state.json); the private lab has its own.
WIRING = ("_PORT", "_HOST", "_ENGINE_TARGET", "_REDIS_URL", "_RESUME_STORE", "_REPLICA_ID")


def behaviour(env: Mapping[str, str]) -> dict[str, str]:
    """A service's settings less its wiring: what a private lab inherits."""
    return {k: v for k, v in env.items() if not k.endswith(WIRING)}


PORT_TRIES = 3


def free_ports(options: LabOptions) -> Ports:
    """streamlab/lab/spare_ports.py's, as a scenario's ScenarioUnavailable."""
    try:
        return free_lab_ports(options)
    except StartError as exc:
        raise ScenarioUnavailable(str(exc)) from exc


def say(name: str, message: str) -> None:
    print(f"{name}: {message}", file=sys.stderr, flush=True)


@asynccontextmanager
async def private_lab(lab: LabTarget, name: str, *, gateways: int = 2, engines: int = 1,
                      gateway_env: Mapping[str, str] | None = None,
                      engine_env: Mapping[str, str] | None = None,
                      store: str = "redis") -> AsyncIterator[Lab]:
    """A lab of `gateways` gateways and `engines` engines sharing Redis (or,
    with `store="memory"`, each gateway its own resume log), up for the
    duration of the block."""
    if not isinstance(lab, Lab):
        raise ScenarioUnavailable(
            f"{name} starts a private replica lab of local processes; this target "
            "(compose) cannot: run it against `streamlab up`")
    try:
        find_redis()
    except FileNotFoundError as exc:
        raise ScenarioUnavailable(str(exc)) from exc
    run_dir = Path(tempfile.mkdtemp(prefix=f"streamlab-{name}-"))
    options = LabOptions(
        run_dir=run_dir, nginx=lab.options.nginx, console=False,
        gateways=gateways, engines=engines, store=store,
        gateway_env={**behaviour(lab.options.gateway_env), **SCALE_GATEWAY_ENV,
                     **(gateway_env or {})},
        engine_env={**behaviour(lab.options.engine_env), **SCALE_ENGINE_ENV,
                    **(engine_env or {})})
    private = Lab(free_ports(options), options)
    say(name, f"starting a private lab ({gateways} gateways, {engines} engine(s), {store} "
        f"resume store) on edge port {private.ports.edge_port}, run dir {run_dir}")
    try:
        for attempt in range(PORT_TRIES):
            try:
                await anyio.to_thread.run_sync(private.up)  # stops what it started if it fails
                break
            except StartError as exc:
                # Free when checked, taken before a replica bound it: on a shared
                # machine other labs pick ports in the same range. Other ports.
                if "in use" not in str(exc) or attempt == PORT_TRIES - 1:
                    raise
                private = Lab(free_ports(options), options)
                say(name, f"a port was taken meanwhile; again on edge port "
                    f"{private.ports.edge_port}")
        yield private
    finally:
        await anyio.to_thread.run_sync(lambda: private.down(grace_s=2.0))
        if os.environ.get("STREAMLAB_KEEP_PRIVATE_LABS"):  # its logs, to see why
            say(name, f"private lab stopped; its logs kept in {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
            say(name, "private lab stopped")
