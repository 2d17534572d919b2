"""The gateway's settings: one typed object, built in main() and passed down."""

from __future__ import annotations

import socket
import uuid
from typing import Literal, Self, get_args

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The engine wires' names, spelt here only: engine_client.py's WIRES maps each
# to its implementation (mypy holds its keys to these, a unit test to all of them).
EngineWireName = Literal["per_request", "multiplexed"]
ENGINE_WIRES: tuple[EngineWireName, ...] = get_args(EngineWireName)


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STREAMLAB_GATEWAY_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8090
    # uvicorn's line per response. Off by default: nginx in front already logs
    # every request, and at thousands of stream set-ups a second the gateway's
    # formatting and writing of those lines takes its one worker's CPU (1.9 s
    # of 57 in docs/results/profile-gateway-2500-slow-streams.txt, on the 504s alone).
    access_log: bool = False
    # The listen socket's accept queue: a burst of new connections (thousands of
    # streams opened within seconds) waits here while the worker is busy, rather
    # than being refused. The kernel caps it at net.core.somaxconn.
    backlog: int = Field(8192, ge=1)
    # Where the engine is reached: in the lab, Toxiproxy's "engine" listener.
    engine_target: str = "127.0.0.1:8473"
    # Several engines: one target listing them all (`ipv4:127.0.0.1:8473,127.0.0.1:8483`,
    # gRPC's name syntax), balanced by the channel itself. "auto": round_robin when
    # the target lists several addresses, gRPC's pick_first when it names one.
    engine_balancing: Literal["auto", "round_robin", "pick_first"] = "auto"
    # With round_robin, watch each engine's gRPC health (Health/Watch) and send
    # no new call to one that reports NOT_SERVING (draining). Off only to show
    # what it prevents (tests/integration/test_replicas.py).
    engine_health_checks: bool = True
    # How streams travel to the engine: all on one long-lived Session per
    # engine, an abort a message (multiplexed, vLLM's shape, the default: it
    # measured cheaper in set-up, per token, memory and cancel tail;
    # services/gateway/engine_mux.py), or a gRPC call each (per_request: a
    # cancel is the call's RST_STREAM, the lesson's shape); both are tested
    # end to end (docs/cancellation-and-backpressure.md says why this default).
    engine_wire: EngineWireName = "multiplexed"
    # Seconds between `: ping` comments on an SSE stream (0 disables them).
    heartbeat_s: float = Field(15.0, ge=0)
    # Seconds to wait for the engine to accept a call (its response headers)
    # before answering 504; covers a black-holed engine hop.
    engine_accept_timeout_s: float = Field(5.0, gt=0)
    # Deadline of the explicit Cancel that stops a detachable generation (one
    # that outlives its call, for re-attach by another replica). Short: when it
    # fails, the engine still stops the generation when its orphan grace ends.
    engine_cancel_timeout_s: float = Field(1.0, gt=0)
    # Per-stream deadlines on the engine hop, surfaced as clean error events:
    # silence from the engine (longer than any think pause you expect), and
    # the whole stream's length.
    engine_idle_timeout_s: float = Field(300.0, gt=0)
    max_stream_duration_s: float = Field(3600.0, gt=0)
    # A client that accepts no bytes for this long (its TCP window stays shut)
    # is cut and its generation cancelled. None waits forever (the broken case).
    send_timeout_s: float | None = Field(30.0, gt=0)
    # HTTP/2 keepalive on the engine hop: how a silent, black-holed hop is found
    # even in the middle of a long think pause (ping every N s, dead after M s).
    engine_keepalive_s: float = Field(10.0, gt=0)
    engine_keepalive_timeout_s: float = Field(5.0, gt=0)
    # Reconnecting to the engine after its connection dropped (a restart, a
    # reset, a blip). The connect timeout is how long one attempt may take,
    # TCP plus the HTTP/2 handshake: it must exceed the hop's round trip, or a
    # slow hop (600 ms of latency) is never reconnected across ("connection
    # attempt timed out", 503 for ever). gRPC's knob for it is
    # grpc.min_reconnect_backoff_ms, which bounds the connect deadline, not
    # the wait between attempts. A refused connect (engine down) fails at once
    # whatever it is, so a generous value costs nothing there.
    engine_connect_timeout_s: float = Field(5.0, gt=0)
    # The wait between attempts: the first, growing (x1.6, jittered) up to the
    # maximum. Short, so a restarted engine is usable again within a second.
    engine_reconnect_backoff_s: float = Field(0.1, gt=0)
    engine_reconnect_backoff_max_s: float = Field(1.0, gt=0)
    # How far the engine may run ahead of a client that stopped reading, per
    # stream (the gRPC flow-control window the gateway offers; BDP probing off
    # so it never grows). A token is ~30 bytes on this hop: 16 KiB ≈ 550 tokens.
    engine_read_ahead_bytes: int = Field(16_384, ge=1024)
    # Load shedding (services/gateway/limits.py): streams open at once, overall
    # and per client key; past either, 429 with Retry-After. Sized for 5,000+
    # slow streams on one worker (~30 KiB each); per client stays a fairness cap.
    max_streams: int = Field(8192, ge=1)
    max_streams_per_client: int = Field(64, ge=1)
    retry_after_s: int = Field(1, ge=0)
    # Set-up admission (services/gateway/admission.py): new streams set up per
    # second, a burst of 50 ms worth, the rest waiting their turn up to
    # `admission_max_wait_s` (past it: 503 + Retry-After), so that a ramp of new
    # streams does not starve the running ones. 0: no admission control.
    admission_rate_per_s: float = Field(0.0, ge=0)
    admission_max_wait_s: float = Field(10.0, ge=0)
    # Request size: bytes of body, characters of prompt (all messages together).
    max_body_bytes: int = Field(1_000_000, ge=1024)
    max_prompt_chars: int = Field(100_000, ge=1)
    # Graceful drain on SIGTERM (services/gateway/drain.py): live streams get this
    # long to finish; the rest are told to come back after `drain_retry_ms`.
    drain_grace_s: float = Field(10.0, ge=0)
    drain_retry_ms: int = Field(1000, ge=0)
    # Bearer keys accepted on /v1/* and /ws (services/gateway/auth.py). Empty: no
    # auth (the lab's default). As an env var, a JSON list: '["sk-lab-1"]'.
    api_keys: list[str] = Field(default_factory=list, repr=False)
    # Whether a request may select a broken behaviour for contrast (the
    # `streamlab` knobs relay=detached_unbounded, engine_errors=swallow,
    # job_ttl_s=0; see openai_api.py). Off unless asked for: a client must not
    # be able to pick a leak. The lab (streamlab/lab/local.py, compose.yaml) turns
    # it on, since showing them is what it is for.
    allow_broken_modes: bool = False
    # Model name reported in responses and listed by GET /v1/models.
    model_name: str = "streamlab-fake"
    # Other names a request's `model` may use for it (the lab's clients send
    # "streamlab-fake" whatever the backend); any other name is a 404
    # `model_not_found`, and no `model` at all means this one.
    model_aliases: list[str] = Field(default_factory=lambda: ["streamlab-fake"])

    # ---- other sites (services/gateway/ws_routes.py; docs/api.md) -----------------
    # Browsers let any page open a WebSocket to any host, sending the page's
    # Origin; /ws opens only for these, and for clients that send no Origin
    # (not browsers). The lab console's page (http://127.0.0.1:PORT and
    # http://localhost:PORT; the lab sets its port from lab.env's
    # STREAMLAB_CONSOLE_PORT) and each of `ws_allowed_origins`
    # ("scheme://host[:port]", exact). None: not even the console's.
    console_port: int | None = Field(8475, ge=1, le=65535)
    ws_allowed_origins: list[str] = Field(default_factory=list)
    # The API's own description (/openapi.json, /docs, /redoc): off, since
    # it would answer anyone through the edge without a key.
    api_docs: bool = False

    # ---- who is asking (services/gateway/identity.py) -----------------------------
    # The client's identity for the per-client caps and for who owns a stream or
    # a job: the bearer key (hashed) when auth is on, else the client's address.
    # The address is the peer's, or the one the proxy in front forwards
    # (X-Forwarded-For, which nginx sets) when the peer is one of these
    # addresses (uvicorn's `forwarded_allow_ips`; "*" trusts every peer).
    forwarded_allow_ips: str = "127.0.0.1"
    # Trust the client's own `X-Client-Id` header as its identity (without
    # auth): only behind something that sets or checks it, since any client
    # can claim any id.
    trust_client_id_header: bool = False

    # ---- the resume surface (/v1/streams; services/gateway/resume/streams.py) ----------
    # How long a generation keeps running with nobody attached after a client
    # disconnects, buffering into its replay log, before it is cancelled at the
    # engine. 0 cancels at once (the OpenAI route's behaviour). Longer graces
    # survive longer cuts and burn more GPU for clients that never come back.
    resume_grace_s: float = Field(10.0, ge=0)
    # How long a created stream waits for its first GET before it is cancelled.
    resume_attach_timeout_s: float = Field(10.0, gt=0)
    # How long a finished stream stays replayable, then it is evicted (410).
    resume_ttl_s: float = Field(120.0, ge=0)
    # The `retry:` sent to clients: milliseconds before an EventSource reconnects.
    resume_retry_ms: int = Field(1000, ge=0, le=600_000)
    # Each stream's `retry:` is resume_retry_ms plus its own offset in
    # [0, this), drawn from the stream id: after an edge blip the clients come
    # back spread over this window instead of all on the same tick (a
    # reconnect storm, docs/resume.md). On by default: the reconnect-storm
    # scenario's fixed mode is the shipped setting (500 streams back within
    # 10 s, the peak under 4x the steady rate). A stream whose client asked for
    # its own `retry_ms` gets exactly that (its choice). 0: no spread (the
    # storm's broken mode: every stream on the same tick).
    resume_retry_jitter_ms: int = Field(4000, ge=0, le=600_000)
    # New connections on the resume surface (a create, or a GET of the events)
    # per second per gateway, with a burst of one second's worth; past it, 429
    # with Retry-After. 0: no such limit.
    resume_connect_rate_per_s: float = Field(0.0, ge=0)
    # How a reconnect that carries Last-Event-ID meets that rate. "first": it is
    # always let in (it continues a generation already admitted and paid for),
    # and it still spends the bucket, so new streams wait behind a storm of
    # resumes. "same": it is refused like a new stream (the broken case: a
    # storm of resumes starves itself with 429s).
    resume_admission: Literal["first", "same"] = "first"
    # Bounds on replay memory: per stream (oldest events are dropped first, and a
    # resuming client is told about the gap) and for all streams together
    # (finished streams are evicted first, oldest first).
    resume_log_max_events: int = Field(10_000, ge=1)
    resume_log_max_bytes: int = Field(1 << 20, ge=1024)
    resume_total_max_bytes: int = Field(64 << 20, ge=1024)
    # Most streams held at once (running or replayable); more → 503 on create.
    resume_max_streams: int = Field(1000, ge=1)

    # ---- where the resume log lives (services/gateway/resume/store.py) -----------
    # "memory": each gateway holds its own streams (one gateway; a stream id is
    # 404 on any other replica and after a restart). "redis": every replica
    # shares the log in Redis at `redis_url`, so any replica serves a resume,
    # a status and a DELETE (services/gateway/resume/redis_store.py).
    resume_store: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # This gateway's name in the shared store: who owns a generation's engine
    # call, and the control channel a DELETE elsewhere reaches it on. Empty:
    # hostname:port (unique per replica on one host and across hosts).
    replica_id: str = ""
    # Every Redis call's bound (connect and each reply): a store that is down or
    # black-holed answers a resume with 503 within this, never a hang. A live
    # tail blocks on Redis for less than this (a third of it) per read.
    redis_timeout_s: float = Field(1.0, gt=0)
    # A reader on a replica that does not own the generation counts for the
    # owner's grace timer while its presence is fresh: refreshed at least every
    # third of this, forgotten this long after its replica stopped refreshing it.
    redis_follower_ttl_s: float = Field(3.0, gt=0)
    # How long an expired stream's id answers 410 rather than 404.
    redis_tombstone_s: float = Field(86_400.0, gt=0)
    # Events a generation's owner keeps for Redis while writes fail (the store
    # is down or slow); past it the oldest are dropped from the shared log (a
    # resume on another replica then gets a `gap`), never from its own readers.
    redis_pending_max_events: int = Field(10_000, ge=1)
    # What the owner's log writer (services/gateway/resume/redis_log.py)
    # survives. "any": any failed write is retried (nothing else can hand the
    # stream on: that is a write to the same store), and a pooled connection
    # whose transport a Redis restart closed is made again before use. The
    # broken case the `redis-restart` scenario contrasts, "store_only": redis-py's
    # own errors only, on redis-py's stock connections: a Redis restart kills
    # writers with uvloop's RuntimeError, and their streams stay `running` in
    # Redis while the owner has finished them (readers elsewhere get pings).
    resume_store_errors: Literal["any", "store_only"] = "any"
    # With the Redis store: open resumable generations as detachable, and when
    # the replica that owns one is lost (killed, or drained for a restart) let
    # the replica a client reads on take it over and re-attach to the engine's
    # generation from the last token the shared log holds, so nothing is lost.
    # False is the broken case the `replica-loss` scenario contrasts:
    # a lost owner ends its streams `cancelled` {"reason": "owner_lost"}, and a
    # drain cancels them (`server_draining`).
    reattach: bool = True
    # With the Redis store: each client identity's cap (max_streams_per_client)
    # counted across the replicas in Redis, each slot on a lease renewed by its
    # gateway, so a killed gateway's slots come back within this many seconds
    # (services/gateway/shared_caps.py). 0: each gateway counts alone (the
    # broken case: N replicas admit N times the cap).
    shared_caps_lease_s: float = Field(10.0, ge=0)
    # Trouble that may pass (the shared store unreachable, this gateway paused,
    # an engine-hop blip): "retry" tells the reader so (SSE `event: retry`, no
    # terminal event; the client reconnects with Last-Event-ID) and re-attaches
    # to a generation whose engine hop dropped. "terminal" is the broken case
    # the `transient-blip` scenario contrasts: an `error` event or a 503 ends
    # the reader, and an engine-hop blip fails the stream (docs/resume.md).
    resume_transient: Literal["retry", "terminal"] = "retry"
    # How long the owner of a resumable stream keeps attaching again (every
    # 0.25 s) to a generation whose engine call dropped, its readers told
    # `event: retry` (`engine_reattaching`) meanwhile, before it takes the
    # generation for lost and ends the stream `error` (`generation_lost`). An
    # engine that answers without the generation ends it at once; a dead one
    # says nothing, so this is how long a SIGKILLed engine's readers wait. It
    # must outlast the hop blips to survive: a 2 s blip of both engine hops
    # had its tokens back within 3.9 s of its start over 240 streams, both
    # wires, and a 3 s window lost half of them (`streamlab bench
    # engine-death`, docs/resume.md), hence 6 s; and stay below the engine's
    # orphan grace (60 s), which stops what nobody attaches.
    reattach_window_s: float = Field(6.0, gt=0)
    # How long a replica that took a lost owner's stream over keeps trying to
    # attach to its generation while the engines answer 503/504 (a 404 ends it
    # at once): longer than the owner's own window, since the engines are up
    # and one slow to answer is load, not death (a storm's survivor takes
    # hundreds over at once); below the engine's orphan grace (60 s).
    takeover_window_s: float = Field(20.0, gt=0)

    # ---- polling jobs (/v1/jobs; services/gateway/jobs.py) -----------------------
    # A job nobody polls for this many seconds is cancelled at the engine and
    # deleted; 0 keeps jobs forever (the classic polling leak, kept switchable so the
    # lab can show it).
    job_ttl_s: float = Field(30.0, ge=0)
    # The longest a long-polling request may hold before answering "nothing yet".
    long_poll_max_s: float = Field(30.0, gt=0)
    # With several gateways, a job lives in the one that started it: its ids
    # begin with this tag (`g2.` + hex), which nginx maps to that gateway alone
    # (streamlab/lab/nginx.py `job_routes`). Empty: one gateway, plain hex ids.
    job_route: str = Field("", pattern=r"^(g[1-9][0-9]*)?$")

    @model_validator(mode="after")
    def _name_the_replica(self) -> Self:
        if not self.replica_id:
            host = socket.gethostname() or uuid.uuid4().hex[:12]
            self.replica_id = f"{host}:{self.port}"
        return self

    @model_validator(mode="after")
    def _backoff_grows(self) -> Self:
        if self.engine_reconnect_backoff_max_s < self.engine_reconnect_backoff_s:
            raise ValueError("engine_reconnect_backoff_max_s must be at least "
                             "engine_reconnect_backoff_s")
        return self
