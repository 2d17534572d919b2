"""The engine's settings: one typed object, built in main() and passed down."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class FakeModelDefaults(BaseSettings):
    """Timing of the fake model when a request does not shape it (the seed's numbers)."""

    model_config = SettingsConfigDict(env_prefix="STREAMLAB_FAKE_", extra="ignore")

    prefill_ms: int = Field(300, ge=0)
    token_gap_ms: int = Field(50, ge=0)
    answer_tokens: int = Field(50, ge=1)


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STREAMLAB_ENGINE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 50051
    backend: Literal["fake"] = "fake"
    # Generations running at once (GPU slots), and how many more may wait for
    # one; past both the engine answers RESOURCE_EXHAUSTED at once.
    max_running_generations: int = Field(64, ge=1)
    max_queued_generations: int = Field(64, ge=0)
    # Upper bound on max_tokens a request may ask for.
    max_tokens_limit: int = Field(4096, ge=1)
    # How many finished generations GetStats remembers.
    stats_history: int = Field(2048, ge=1)
    # HTTP/2 keepalive from the engine's side: finds a dead gateway connection
    # (e.g. a black-holed hop) and cancels its calls, so nothing generates on.
    keepalive_s: float = Field(20.0, gt=0)
    keepalive_timeout_s: float = Field(5.0, gt=0)
    # Seconds live calls get to finish on SIGTERM before they are cancelled.
    shutdown_grace_s: float = Field(5.0, ge=0)
    fake: FakeModelDefaults = Field(default_factory=FakeModelDefaults)
