"""The engine's settings: one typed object, built in main() and passed down."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class FakeModelDefaults(BaseSettings):
    """Timing of the fake model when a request does not shape it: a chat model's usual pace."""

    model_config = SettingsConfigDict(env_prefix="STREAMLAB_FAKE_", extra="ignore")

    prefill_ms: int = Field(300, ge=0)
    token_gap_ms: int = Field(50, ge=0)
    answer_tokens: int = Field(50, ge=1)
    # Which clock makes the tokens when a request does not choose: one decode
    # clock stepping every running generation together (continuous batching),
    # or a timer per generation (services/engine/backends/decode_clock.py).
    clock: Literal["batched", "per_stream"] = "batched"
    # The batched clock's step: step_ms + step_per_sequence_ms x running
    # generations, the shape of a GPU step. 0: the clock steps whenever a
    # generation is due, so each request's own gap sets the pace.
    step_ms: float = Field(0.0, ge=0)
    step_per_sequence_ms: float = Field(0.0, ge=0)


class HFSettings(BaseSettings):
    """The transformers backend (services/engine/backends/hf.py)."""

    model_config = SettingsConfigDict(env_prefix="STREAMLAB_HF_", extra="ignore")

    # A local directory written by save_pretrained, or a hub name where a hub is
    # reachable (set HF_HUB_OFFLINE=1 to be sure nothing is fetched).
    model: str = ""
    # "auto": the first CUDA device when torch sees one, else the CPU.
    device: str = "auto"
    # "auto": bfloat16 on a GPU that supports it, float16 on other GPUs, float32 on CPU.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # 0 decodes greedily (deterministic: the lab's tests rely on it); above 0 samples.
    temperature: float = Field(0.0, ge=0)
    seed: int = 0
    # Keep decoding past end-of-sequence until max_tokens (benchmarks want a fixed length).
    ignore_eos: bool = False
    # torch CPU threads (0: torch's default, one per core).
    cpu_threads: int = Field(0, ge=0)
    trust_remote_code: bool = False
    # Generations decoded together, one forward pass per step over all of them
    # (the engine's running slots); the rest wait in the engine's queue.
    max_batch: int = Field(8, ge=1)


class OpenAIUpstreamSettings(BaseSettings):
    """The OpenAI-compatible upstream backend (services/engine/backends/openai_upstream.py)."""

    model_config = SettingsConfigDict(env_prefix="STREAMLAB_OPENAI_", extra="ignore")

    # Up to and including the version prefix, e.g. http://127.0.0.1:8000/v1
    base_url: str = ""
    # Sent as `model`; vLLM wants the served name, Ollama a tag.
    model: str = ""
    api_key: SecretStr | None = None
    connect_timeout_s: float = Field(5.0, gt=0)
    # Longest silence between bytes (a long prefill, a think pause) before the
    # generation fails with DEADLINE_EXCEEDED.
    read_timeout_s: float = Field(120.0, gt=0)
    # Forward the request's fake-model timing as the `streamlab` body field:
    # only for an upstream that is itself a streamlab gateway (a chained lab).
    forward_streamlab_timing: bool = False


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STREAMLAB_ENGINE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 50051
    # Prometheus /metrics over plain HTTP on this port, same host (the gRPC port
    # speaks only gRPC). None: no listener (in-process tests); the lab sets it
    # from lab.env's STREAMLAB_ENGINE_METRICS_PORT.
    metrics_port: int | None = Field(None, ge=0, le=65535)
    backend: Literal["fake", "hf", "openai"] = "fake"
    # Generations running at once (GPU slots), and how many more may wait for
    # one; past both the engine answers RESOURCE_EXHAUSTED at once. A backend
    # with a concurrency of its own lowers the first (the hf backend: its max_batch).
    # The fake model steps every running generation on one clock, so thousands
    # cost little: sized for 5,000+ streams through the lab.
    max_running_generations: int = Field(8192, ge=1)
    max_queued_generations: int = Field(1024, ge=0)
    # Upper bound on max_tokens a request may ask for. 16,384: a stream must be
    # able to outlast what the hops of the chain buffer (~1 MB of SSE, ~4,000
    # tokens on loopback) for a reader that stopped to be seen stopping
    # (scenario slow-reader-edge); served models allow as much and more.
    max_tokens_limit: int = Field(16384, ge=1)
    # How many finished generations GetStats remembers.
    stats_history: int = Field(2048, ge=1)
    # HTTP/2 keepalive from the engine's side: finds a dead gateway connection
    # (e.g. a black-holed hop) and cancels its calls, so nothing generates on.
    keepalive_s: float = Field(20.0, gt=0)
    keepalive_timeout_s: float = Field(5.0, gt=0)
    # Seconds live calls get to finish on SIGTERM before they are cancelled.
    shutdown_grace_s: float = Field(5.0, ge=0)
    # A detachable generation (the gateway's resumable streams) whose caller
    # vanished without an explicit Cancel (its gateway was SIGKILLed, the
    # connection died) keeps running this long, so another gateway can Attach
    # to it and the client's resume still ends with the whole text; nobody
    # attached by then, it is cancelled. 0: cancelled at once, as a generation
    # that is not detachable (services/engine/detached.py). 60 s: above the
    # worst take-over time docs/resume.md adds up (an orphan holds its slot
    # paused, it does not generate on).
    orphan_grace_s: float = Field(60.0, ge=0)
    # Tokens a detachable generation keeps for an Attach (the newest ones).
    orphan_buffer_tokens: int = Field(4096, ge=1)
    fake: FakeModelDefaults = Field(default_factory=FakeModelDefaults)
    hf: HFSettings = Field(default_factory=HFSettings)
    openai: OpenAIUpstreamSettings = Field(default_factory=OpenAIUpstreamSettings)
