"""What `streamlab check` checks: an OpenAI-compatible base URL and a model,
and what that server offers beyond the OpenAI API.

Some checks need something a foreign server may not give; each names it
(`Needs`) and is n/a with that reason when it is missing, instead of guessing:

    silence     a long silence before the first token. On a streamlab gateway
                the request's `streamlab.prefill_ms` makes one; on any other
                server a long prompt is the only lever, and a fast server may
                answer too soon for a heartbeat to be needed (n/a, not fail).
    metrics     a Prometheus /metrics with a gauge of running generations whose
                name is known (KNOWN_RUNNING_GAUGES, or --running-gauge); found
                at the server's root when not given (metrics.py). Without one
                the cancel check feels for leftover generations by timing
                (a fresh stream waits behind them on a server with few slots).
    long        an answer of megabytes: a shorter one fits the transport's
                buffers whole, so a stopped reader cannot be felt by the server.
    resumable   a surface that resumes a stream: `POST /streams` whose events
                take `Last-Event-ID`, or background Responses (`starting_after`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from enum import StrEnum
from urllib.parse import urlsplit, urlunsplit

from streamlab.experiments.report import JSON

# Gauges of generations running now, by server: the name and what it is (each
# read from the server's own metrics code or docs, 2026-12).
KNOWN_RUNNING_GAUGES: dict[str, str] = {
    "vllm:num_requests_running": "vLLM's requests running on the GPU (also llm-d's simulator)",
    "sglang:num_running_reqs": "SGLang's running requests",
    "llamacpp:requests_processing": "llama.cpp's server: requests processing (--metrics)",
    "tgi_batch_current_size": "TGI's current batch size",
    "streamlab_engine_running": "the lab engine's generations holding a slot",
}


class Needs(StrEnum):
    SILENCE = "silence"
    METRICS = "metrics"
    LONG = "long"
    RESUMABLE = "resumable"


@dataclass(frozen=True)
class CheckTarget:
    base_url: str  # http://host:port/v1, as OpenAI SDKs take it
    model: str
    api_key: str | None = None
    metrics_url: str | None = None  # a Prometheus /metrics of the server behind the URL
    running_gauge: str | None = None  # a gauge of running generations KNOWN_RUNNING_GAUGES lacks
    lab_knobs: bool = False  # the server takes the lab's `streamlab` request object
    silence_s: float = 25.0  # the silence to ask a streamlab gateway for before the first token
    idle_cut_s: float = 20.0  # the idle cut a heartbeat must beat (a proxy's read timeout)
    streams: int = 8  # concurrency check: streams at once
    stop_within_s: float = 5.0  # cancel check: the generation stops within this
    timeout_s: float = 60.0  # every request's read timeout: no check hangs
    stream_deadline_s: float = 120.0  # no stream is read for longer (an answer that never ends)
    # Levers for a real server: merged into every request (ignore_eos, min_tokens,
    # chat_template_kwargs, ...), the long prompt's length for a prefill (silence),
    # and the long answer's length (cancel, slow reader): a 4k-context model needs less.
    extra_body: dict[str, JSON] = field(default_factory=dict)
    prompt_words: int = 3000
    answer_tokens: int = 12000
    leave_streams: int = 2  # cancel by timing: streams left at once
    # The URL as given, when base_url is a hop in front of it (via()): the
    # slow-reader check goes straight there, a hop's buffers would hide the server.
    origin_url: str | None = None

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {self.base_url!r}")

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.base_url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def plain_http(self) -> bool:
        return urlsplit(self.base_url).scheme == "http"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def via(self, host: str, port: int) -> CheckTarget:
        """The same target reached through a hop listening on host:port (plain
        http: a TCP hop in front of TLS would break the certificate's name)."""
        parts = urlsplit(self.base_url)
        return replace(self, origin_url=self.origin_url or self.base_url, base_url=urlunsplit(
            ("http", f"{host}:{port}", parts.path, parts.query, parts.fragment)))

    def direct(self) -> CheckTarget:
        """The same target with no hop of the check's in front."""
        return replace(self, base_url=self.origin_url or self.base_url, origin_url=None)

    @property
    def api_url(self) -> str:
        return self.base_url.rstrip("/")

    def body(self, content: str, *, max_tokens: int, lab: dict[str, JSON] | None = None,
             **extra: JSON) -> dict[str, JSON]:
        """A streamed chat request; `lab` (the fake model's timing) is sent only
        to a target that takes the lab's knobs, over the `streamlab` object of
        --extra-body (a user's `pauses` or `heartbeat_s` stay; the check's own
        timing wins)."""
        out: dict[str, JSON] = {"model": self.model, "stream": True, "max_tokens": max_tokens,
                                  "messages": [{"role": "user", "content": content}],
                                  **self.extra_body, **extra}
        if lab and self.lab_knobs:
            asked = self.extra_body.get("streamlab")
            out["streamlab"] = {**(asked if isinstance(asked, dict) else {}), **lab}
        return out

    def long_prompt(self, task: str) -> str:
        """`task` over `prompt_words` words of notes: a prefill the server must
        do, every time. It starts with a nonce: a server with a prefix cache
        (vLLM, SGLang, llama.cpp) would skip the prefill of a prompt it has seen."""
        notes = " ".join(f"note{i % 97}" for i in range(self.prompt_words))
        return f"Request {uuid.uuid4().hex}. {task} {notes}"

    @property
    def root_url(self) -> str:
        """scheme://host:port of the URL as given (not the check's hop in front
        of it): where servers serve /metrics."""
        parts = urlsplit(self.origin_url or self.base_url)
        return urlunsplit((parts.scheme, parts.netloc, "", "", ""))
