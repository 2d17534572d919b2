"""The gateway's settings: one typed object, built in main() and passed down."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STREAMLAB_GATEWAY_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8090
    # Where the engine is reached: in the lab, Toxiproxy's "engine" listener.
    engine_target: str = "127.0.0.1:8473"
    # Seconds between `: ping` comments on an SSE stream (0 disables them).
    heartbeat_s: float = Field(15.0, ge=0)
    # Seconds to wait for the engine to accept a call (its response headers)
    # before answering 504; covers a black-holed engine hop.
    engine_accept_timeout_s: float = Field(5.0, gt=0)
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
    # How far the engine may run ahead of a client that stopped reading, per
    # stream (the gRPC flow-control window the gateway offers; BDP probing off
    # so it never grows). A token is ~30 bytes on this hop: 16 KiB ≈ 550 tokens.
    engine_read_ahead_bytes: int = Field(16_384, ge=1024)
    # Load shedding (services/gateway/limits.py): streams open at once, overall
    # and per client key; past either, 429 with Retry-After.
    max_streams: int = Field(512, ge=1)
    max_streams_per_client: int = Field(64, ge=1)
    retry_after_s: int = Field(1, ge=0)
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
    # be able to pick a leak. The lab (streamlab/lab.py, compose.yaml) turns
    # it on, since showing them is what it is for.
    allow_broken_modes: bool = False
    # Model name reported in responses and listed by GET /v1/models.
    model_name: str = "streamlab-fake"
    # Other names a request's `model` may use for it (the lab's clients send
    # "streamlab-fake" whatever the backend); any other name is a 404
    # `model_not_found`, and no `model` at all means this one.
    model_aliases: list[str] = Field(default_factory=lambda: ["streamlab-fake"])

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

    # ---- the resume surface (/v1/streams; services/gateway/streams.py) ----------
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
    # Bounds on replay memory: per stream (oldest events are dropped first, and a
    # resuming client is told about the gap) and for all streams together
    # (finished streams are evicted first, oldest first).
    resume_log_max_events: int = Field(10_000, ge=1)
    resume_log_max_bytes: int = Field(1 << 20, ge=1024)
    resume_total_max_bytes: int = Field(64 << 20, ge=1024)
    # Most streams held at once (running or replayable); more → 503 on create.
    resume_max_streams: int = Field(1000, ge=1)

    # ---- polling jobs (/v1/jobs; services/gateway/jobs.py) -----------------------
    # A job nobody polls for this many seconds is cancelled at the engine and
    # deleted; 0 keeps jobs forever (the classic polling leak, kept switchable so the
    # lab can show it).
    job_ttl_s: float = Field(30.0, ge=0)
    # The longest a long-polling request may hold before answering "nothing yet".
    long_poll_max_s: float = Field(30.0, gt=0)
