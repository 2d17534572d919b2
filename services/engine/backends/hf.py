"""The transformers backend: a causal LM decoded one step at a time, off the event loop.

    gRPC handler task (event loop)            decode thread (one, shared)
    ─────────────────────────────             ───────────────────────────
    (the engine's admission queue has given it the model: max_concurrency = 1)
    loop: await run_in_executor(step) ──────▶ step(): one forward pass with the
                                               KV cache, pick a token, count it
                                               (tracker.generated()), detokenise
          ◀────────────────────────────────── the text it completes ("" if none)
          yield text (gRPC write)
    finally: decode.close()                    the cache is dropped by close(), or
                                               by the step in flight when it ends

Cancellation: the handler is cancelled at its `await` on the step. The step in
flight (at most one) finishes, is counted (so `tokens_after_cancel` ≤ 1), sees
the generation closed and drops the KV cache; no further step is submitted.
On a GPU that returns the cache's memory (`torch.cuda.memory_allocated`);
PyTorch keeps it reserved for the next request rather than giving it back to
the driver.

The loop never runs ahead of the gRPC stream: the next step is submitted when
the previous token has been handed to grpc, so a slow reader slows the model
down instead of piling up tokens (the fake model behaves the same way).

Importing this module imports torch: `make_backend` imports it only when the
engine is configured with `backend=hf`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from services.engine.backends.base import (
    Accepted,
    BackendError,
    BackendLoad,
    GenerationInput,
    GenerationSummary,
    TokenTracker,
)
from services.engine.backends.detokenize import IncrementalDetokenizer
from services.engine.settings import HFSettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb

log = logging.getLogger("streamlab.engine.hf")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(RuntimeError):
    """The model or tokenizer could not be loaded; names the setting to fix."""


def pick_device(setting: str) -> torch.device:
    if setting == "auto":
        setting = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(setting)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"STREAMLAB_HF_DEVICE={setting!r} but torch sees no CUDA device")
        if device.index is None:  # name the device: "cuda:0" in stats and logs
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def pick_dtype(setting: str, device: torch.device) -> torch.dtype:
    if setting != "auto":
        return _DTYPES[setting]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32  # CPU half precision is slow or unsupported for many ops


@dataclass
class LoadedModel:
    model: Any  # a transformers PreTrainedModel with a causal LM head
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    eos_ids: frozenset[int]
    max_positions: int | None
    # transformers renamed the forward argument `past_key_values` to `cache`.
    cache_arg: str
    keeps_one_logit: bool


def load(settings: HFSettings) -> LoadedModel:
    if not settings.model:
        raise ModelLoadError(
            "the hf backend needs a model: set STREAMLAB_HF_MODEL (or `streamlab up --model`) "
            "to a directory written by save_pretrained, or a hub name"
        )
    device = pick_device(settings.device)
    dtype = pick_dtype(settings.dtype, device)
    if settings.cpu_threads:
        torch.set_num_threads(settings.cpu_threads)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            settings.model, trust_remote_code=settings.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            settings.model, dtype=dtype, trust_remote_code=settings.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not load STREAMLAB_HF_MODEL={settings.model!r}: {exc}"
                             ) from exc
    model.to(device)
    model.eval()
    params = inspect.signature(model.forward).parameters
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
        eos_ids=_eos_ids(model, tokenizer),
        max_positions=getattr(model.config, "max_position_embeddings", None),
        cache_arg="cache" if "cache" in params else "past_key_values",
        keeps_one_logit="logits_to_keep" in params,
    )


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)


def render_prompt(tokenizer: Any, request: GenerationInput) -> tuple[str, bool]:
    """The text to feed the model, and whether the tokenizer should add its
    special tokens (a chat template already contains them)."""
    if request.prompt and not request.messages:
        return request.prompt, True
    messages = [{"role": m.role, "content": m.content} for m in request.messages]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return str(text), False
    # A base model without a chat template: a plain transcript it can continue.
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"]), True


class _Decode:
    """One generation on the model. `step` runs only on the decode thread;
    `close` may run on the event loop at any moment (a cancel)."""

    def __init__(self, loaded: LoadedModel, request: GenerationInput, settings: HFSettings,
                 tracker: TokenTracker, generator: torch.Generator | None) -> None:
        self._m = loaded
        self._request = request
        self._settings = settings
        self._tracker = tracker
        self._generator = generator
        self._lock = threading.Lock()
        self._closed = False
        self._in_step = False
        self._cache: Any = None
        self._next: torch.Tensor | None = None
        self._detok: IncrementalDetokenizer | None = None
        self._max_new = request.max_tokens
        self.prompt_tokens = 0
        self.produced = 0
        self.finished = False
        self.by_length = False

    def step(self) -> str:
        """One decode step (the first one is the prefill). Returns the text it completes."""
        with self._lock:
            if self._closed:
                return ""
            self._in_step = True
        try:
            return self._step()
        except torch.cuda.OutOfMemoryError as exc:
            raise BackendError("out_of_memory", f"the device ran out of memory: {exc}",
                               status="RESOURCE_EXHAUSTED") from exc
        except RuntimeError as exc:
            raise BackendError("model_error", f"{type(exc).__name__}: {exc}") from exc
        finally:
            with self._lock:
                self._in_step = False
                if self._closed:
                    self._release()

    def close(self) -> str:
        """Stop: no further step runs. Returns text held back by the detokeniser."""
        with self._lock:
            self._closed = True
            if not self._in_step:
                self._release()
        return self._detok.flush() if self._detok is not None and self.finished else ""

    def _release(self) -> None:
        self._cache = None
        self._next = None

    def _step(self) -> str:
        m = self._m
        with torch.inference_mode():
            inputs = self._prefill_inputs() if self._cache is None else self._next
            kwargs: dict[str, Any] = {m.cache_arg: self._cache, "use_cache": True}
            if m.keeps_one_logit:
                kwargs["logits_to_keep"] = 1
            logits = m.model(inputs, **kwargs).logits[:, -1, :]
            token = self._pick(logits)
        # Counted the moment the model has produced it, before it leaves (and
        # even when a cancel arrived during this step: that is wasted work).
        self._tracker.generated()
        self.produced += 1
        token_id = int(token.item())
        self._next = token.view(1, 1)
        if token_id in m.eos_ids and not self._settings.ignore_eos:
            self.finished = True
            return ""
        if self.produced >= self._max_new:
            self.finished = self.by_length = True
        assert self._detok is not None
        return self._detok.push(token_id)

    def _prefill_inputs(self) -> torch.Tensor:
        m = self._m
        text, special = render_prompt(m.tokenizer, self._request)
        ids: list[int] = list(m.tokenizer(text, add_special_tokens=special)["input_ids"])
        if not ids:
            raise BackendError("empty_prompt", "the prompt tokenises to nothing",
                               status="INVALID_ARGUMENT")
        self.prompt_tokens = len(ids)
        if m.max_positions is not None:
            room = m.max_positions - len(ids)
            if room < 1:
                raise BackendError(
                    "prompt_too_long",
                    f"the prompt is {len(ids)} tokens; the model's context is {m.max_positions}",
                    status="INVALID_ARGUMENT")
            self._max_new = min(self._max_new, room)
        self._detok = IncrementalDetokenizer(m.tokenizer, context_ids=ids)
        self._cache = _new_cache(m.model.config)
        return torch.tensor([ids], dtype=torch.long, device=m.device)

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        if self._settings.temperature <= 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / self._settings.temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=self._generator).view(-1)


def _new_cache(config: Any) -> Any:
    try:
        return DynamicCache(config=config)
    except TypeError:  # transformers before the layered caches
        return DynamicCache()


class HFModel:
    """Concurrency: one generation decodes at a time, no batching (one sequence
    per forward pass; two interleaved decode loops would each run at half speed
    while both held a KV cache). The engine queues the others, bounded and FIFO,
    and refuses past the bound; a waiter whose caller leaves leaves the queue.
    Serving many users at once is a batching server's job: put vLLM or
    llama.cpp's server behind the `openai` backend for that."""

    name = "hf"
    # Accepted at once: a queue wait or a prefill is silence the gateway covers with pings.
    defers_acceptance = False
    max_concurrency: int | None = 1

    def __init__(self, settings: HFSettings) -> None:
        self._settings = settings
        self._loaded = load(settings)
        # One thread: one generation decodes at a time (max_concurrency), and a
        # cancelled generation's last step must finish before the next begins.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-decode")
        self._generator: torch.Generator | None = None
        if settings.temperature > 0:
            self._generator = torch.Generator(device=self._loaded.device)
            self._generator.manual_seed(settings.seed)
        log.info("hf backend: %s on %s (%s)", settings.model, self._loaded.device,
                 self._loaded.dtype)

    def options(self, request: pb.GenerateRequest) -> None:
        return None  # a real model: the fake model's timing means nothing here

    async def generate(
        self, request: GenerationInput, options: None, tracker: TokenTracker
    ) -> AsyncGenerator[str | GenerationSummary | Accepted, None]:
        loop = asyncio.get_running_loop()
        decode = _Decode(self._loaded, request, self._settings, tracker, self._generator)
        try:
            while not decode.finished:
                text = await loop.run_in_executor(self._executor, decode.step)
                if text:
                    yield text
        finally:
            tail = decode.close()
        if tail:
            yield tail
        yield GenerationSummary(prompt_tokens=decode.prompt_tokens,
                                completion_tokens=decode.produced,
                                finished_by_length=decode.by_length)

    def finished_by_length(self, request: GenerationInput, options: None, produced: int) -> bool:
        return produced >= request.max_tokens  # not used: generate() yields a summary

    def load(self) -> BackendLoad:
        device = self._loaded.device
        memory = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        return BackendLoad(device=str(device), device_memory_allocated=memory)

    async def aclose(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
