"""What the gateway holds while it runs, as one typed object built by
`create_app(settings, engine=...)` and read by every route through
`GatewayDep`.

    settings      GatewaySettings, built in main() and passed down
    metrics       the app's own Prometheus registry
    drain         live engine calls, for a graceful shutdown
    limiter       the caps on work in flight, overall and per client identity
    shared_caps   the per-identity cap counted across replicas (Redis), or None
    models        the model names a request may ask for
    broken_modes  the lab's broken modes: refused or applied, per request
    streams       the resume surface's store (/v1/streams): this gateway's
                  memory, or the log shared in Redis (settings.resume_store)
    jobs          the polling surface's job store (/v1/jobs)
    engine        the engine client: given to create_app (a test's scripted
                  engine), or the gRPC client the lifespan opens and closes
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from services.gateway.admission import SetupAdmission
from services.gateway.broken_modes import BrokenModes
from services.gateway.drain import Drain
from services.gateway.engine_client import Engine
from services.gateway.identity import client_identity
from services.gateway.jobs import JobMetrics, JobStore
from services.gateway.lease import EngineLease
from services.gateway.limits import ConnectRate, StreamLimiter
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai_api import ChatCompletionRequest
from services.gateway.resume import ResumeStore, build_store
from services.gateway.settings import GatewaySettings
from services.gateway.shared_caps import build_shared_caps


class GatewayState:
    def __init__(self, settings: GatewaySettings, engine: Engine | None = None) -> None:
        self.settings = settings
        self.metrics = GatewayMetrics()
        self.drain = Drain(settings.drain_grace_s)
        self.limiter = StreamLimiter(settings.max_streams, settings.max_streams_per_client,
                                     settings.retry_after_s)
        # The per-client cap across replicas (the Redis store on), else None.
        self.shared_caps = build_shared_caps(settings, self.metrics.registry)
        # New connections to the resume surface per second (0: unlimited).
        self.connect_rate = ConnectRate(settings.resume_connect_rate_per_s,
                                        settings.retry_after_s)
        # New engine calls set up per second (0: as they come).
        self.admission = SetupAdmission(settings.admission_rate_per_s,
                                        settings.admission_max_wait_s)
        self.broken_modes = BrokenModes(settings.allow_broken_modes)
        self.streams: ResumeStore = build_store(settings, self.metrics.registry)
        self.jobs = JobStore(settings.job_ttl_s, JobMetrics(self.metrics.registry),
                             route=settings.job_route)
        self.models = frozenset([settings.model_name, *settings.model_aliases])
        self._engine = engine

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise RuntimeError("the engine client is opened by the app's lifespan")
        return self._engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        self._engine = engine

    @property
    def has_engine(self) -> bool:
        return self._engine is not None

    def identity(self, connection: HTTPConnection) -> str:
        return client_identity(connection, self.settings)

    def lease(self, body: ChatCompletionRequest | None, request_id: str,
              client_key: str | None, surface: str = "sse",
              detachable: bool = False, traceparent: str | None = None) -> EngineLease:
        return EngineLease(self, body, request_id, client_key, surface, detachable,
                           traceparent)


async def gateway_state(connection: HTTPConnection) -> GatewayState:
    # `async def`, though it awaits nothing: FastAPI runs a plain `def`
    # dependency in the thread pool, a hop through anyio's worker threads on
    # every request (4.4 s of 57 in a profile of 2,500 stream set-ups:
    # docs/results/profile-gateway-2500-slow-streams.txt). tests/unit/gateway/
    # test_no_threadpool.py keeps every route's dependencies on the loop.
    state: GatewayState = connection.app.state.gateway
    return state


GatewayDep = Annotated[GatewayState, Depends(gateway_state)]
