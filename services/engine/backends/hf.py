"""The transformers backend: continuous batching on one decode thread, off the event loop.

    gRPC handler tasks (event loop)           decode thread ("hf-decode", one per engine)
    ───────────────────────────────           ───────────────────────────────────────────
    (the engine's admission queue lets in up to max_concurrency = STREAMLAB_HF_MAX_BATCH)
    submit(sequence) ───────────────────────▶ between two steps: prefill it (a forward
                                               pass of its own), its first token, then
                                               its cache joins the batch (hf_batch.py)
                                               each step: ONE forward pass over every
                                               sequence in the batch, one token each,
                                               tracker.generated(), detokenise
    await sequence.take() ◀─────────────────── the text, into the sequence's ready queue
    yield text (gRPC write)
    finally: close(sequence) ───────────────▶ before the next step: its row leaves the
                                               batch and its KV cache is freed

Cancellation: the handler is cancelled at its `await` on the ready queue, and
its `finally` closes the sequence. The step in flight (at most one) finishes
and is counted (so `tokens_after_cancel` ≤ 1); the next step is taken without
that row, as TGI's filter-batch does. On a GPU that returns the row's memory
(`torch.cuda.memory_allocated`); PyTorch keeps it reserved for the next request.

Flow control: a sequence's ready queue holds at most MAX_READY tokens. A
reader that is behind (gRPC flow control holds the handler's `yield`) fills
it; its row then leaves the batch, its cache kept aside, and comes back (as a
join, without a prefill) once the reader takes a token. So a slow reader
slows only its own sequence; the others keep their step, and the model never
runs ahead of a reader by more than MAX_READY tokens.

Errors: a prompt the model cannot take (empty, too long) and a failure in a
sequence's own prefill end that sequence only; a failure in a batched step
(out of device memory → RESOURCE_EXHAUSTED) ends every sequence in that step,
since the step's output is lost for all of them, and drops the batch.

Importing this module imports torch: `make_backend` imports it only when the
engine is configured with `backend=hf`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator
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
from services.engine.backends.hf_batch import PaddedBatch, RowCache, batchable
from services.engine.errors import EngineException
from services.engine.settings import HFSettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb

log = logging.getLogger("streamlab.engine.hf")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(EngineException, RuntimeError):
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


# Tokens a sequence's ready queue holds for a reader that is behind before its
# row leaves the batch. Small: the model runs at most this far ahead of a reader,
# yet a reader a step or two behind (the event loop busy) keeps its seat.
MAX_READY = 4


class _End:
    """The decode thread's last item for a sequence: it finished (end of sequence or length)."""


_END = _End()


@dataclass(frozen=True)
class Sampling:
    """How one sequence picks its tokens, from the request's SamplingOptions
    (each unset field: the engine's STREAMLAB_HF_* default). Temperature 0 is
    greedy (argmax, as with no options at all); above 0 it samples from the
    softmax at that temperature, within the top_p nucleus, with a generator of
    its own, seeded by the request's seed: the same seed and prompt give the
    same text, whatever else shares the batch."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None  # None: a seed drawn from the engine's own sequence

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def read_sampling(request: pb.GenerateRequest, settings: HFSettings) -> Sampling:
    sampling = request.sampling if request.HasField("sampling") else pb.SamplingOptions()
    temperature = (sampling.temperature if sampling.HasField("temperature")
                   else settings.temperature)
    top_p = sampling.top_p if sampling.HasField("top_p") else 1.0
    if not 0 < top_p <= 1:
        top_p = 1.0  # the gateway already refuses these; 0 would leave nothing to pick
    return Sampling(temperature=max(0.0, temperature), top_p=top_p,
                    seed=sampling.seed if sampling.HasField("seed") else None)


class _Sequence:
    """One generation. `closed` and `ready` are shared with the event loop under
    the decode loop's lock; everything else belongs to the decode thread."""

    def __init__(self, request: GenerationInput, tracker: TokenTracker,
                 loop: asyncio.AbstractEventLoop, sampling: Sampling = Sampling()) -> None:
        self.request = request
        self.sampling = sampling
        self.generator: torch.Generator | None = None  # made by the decode thread
        self.tracker = tracker
        self.loop = loop
        self.wake = asyncio.Event()
        self.ready: deque[str | _End | BackendError] = deque()
        self.closed = False
        self.length = 0  # tokens in its KV cache
        self.next_id = 0  # the token the next step feeds it
        self.detok: IncrementalDetokenizer | None = None
        self.max_new = request.max_tokens
        self.prompt_tokens = 0
        self.produced = 0
        self.by_length = False
        self.ended = False  # finished or failed: it leaves the batch
        self.held: RowCache | None = None  # its cache while its reader is behind

    def full(self) -> bool:
        return len(self.ready) >= MAX_READY


@dataclass(frozen=True)
class StepTiming:
    """Batched decode steps so far: how many, their wall time (inputs, forward
    pass, picking the tokens) and the rows they served. For benchmarks."""

    steps: int = 0
    seconds: float = 0.0
    rows: int = 0


class _DecodeLoop:
    """The decode thread and the batch it owns (see the module doc)."""

    def __init__(self, loaded: LoadedModel, settings: HFSettings, batched: bool) -> None:
        self._m = loaded
        self._settings = settings
        # Seeds for sampled sequences that name none: one reproducible sequence
        # of them per engine start (STREAMLAB_HF_SEED).
        self._seeds = random.Random(settings.seed)
        # A model whose cache cannot be padded runs one sequence at a time
        # (max_concurrency 1), fed as transformers feeds it: no mask, no positions.
        self._batched = batched
        self._cond = threading.Condition()
        self._joining: list[_Sequence] = []
        self._stopping = False
        # Decode thread only: the batch's rows in order, and those held out of it.
        self._batch = PaddedBatch()
        self._rows: list[_Sequence] = []
        self._held: list[_Sequence] = []
        self.steps = 0  # forward passes: prefills and batched steps
        self.step_tokens = 0  # tokens they made (step_tokens / steps: the mean batch)
        self.timing = StepTiming()  # the batched steps alone (prefills excluded)
        self._out: list[tuple[_Sequence, list[str | _End | BackendError]]] = []
        self._thread = threading.Thread(target=self._run, name="hf-decode", daemon=True)
        self._thread.start()

    # ---- the event loop's side ------------------------------------------------------
    def submit(self, seq: _Sequence) -> None:
        with self._cond:
            self._joining.append(seq)
            self._cond.notify()

    def close(self, seq: _Sequence) -> None:
        """No step after the one in flight makes a token for it."""
        with self._cond:
            seq.closed = True
            if seq in self._joining:
                self._joining.remove(seq)
            self._cond.notify()

    async def take(self, seq: _Sequence) -> str | _End | BackendError:
        while True:
            with self._cond:
                if seq.ready:
                    was_full = seq.full()
                    item = seq.ready.popleft()
                    if was_full:  # its row may be held out: it can come back
                        self._cond.notify()
                    return item
                seq.wake.clear()
            await seq.wake.wait()

    async def stop(self, timeout_s: float = 30.0) -> None:
        """No new round starts; waits (off the loop) for the one in flight, so a
        process that exits next does not tear torch down under a running step."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        await asyncio.to_thread(self._thread.join, timeout_s)

    # ---- the decode thread ----------------------------------------------------------
    def _run(self) -> None:
        with torch.inference_mode():
            while (joining := self._next_round()) is not None:
                try:
                    self._round(joining)
                except Exception as exc:  # a bug here must not hang every caller
                    log.exception("hf decode loop")
                    self._fail_all(joining, BackendError(
                        "model_error", f"{type(exc).__name__}: {exc}"))

    def _next_round(self) -> list[_Sequence] | None:
        """Wait for work; then, under the lock, take the joiners and settle who
        stays in the batch: a close or a full ready queue seen here counts
        before the next step."""
        with self._cond:
            while not self._stopping and not self._has_work():
                self._cond.wait()
            if self._stopping:
                return None
            joining, self._joining = self._joining, []
            stay = [i for i, s in enumerate(self._rows) if not s.closed and not s.full()]
            hold = [i for i, s in enumerate(self._rows) if not s.closed and s.full()]
            back = [s for s in self._held if not s.closed and not s.full()]
            self._held = [s for s in self._held if not s.closed and s.full()]
        for i in hold:
            self._rows[i].held = self._batch.take(i)
            self._held.append(self._rows[i])
        self._batch.keep(stay)
        self._rows = [self._rows[i] for i in stay]
        self._add(back)
        return joining

    def _has_work(self) -> bool:
        return bool(self._joining
                    or any(s.closed or not s.full() for s in self._rows)
                    or any(s.closed or not s.full() for s in self._held))

    def _round(self, joining: list[_Sequence]) -> None:
        for seq in joining:
            self._prefill(seq)
            self._deliver()
        if self._rows:
            self._step()
            self._deliver()

    def _add(self, seqs: list[_Sequence]) -> None:
        rows = []
        for seq in seqs:
            assert seq.held is not None
            rows.append(seq.held)
            seq.held = None
        self._batch.add(rows)
        self._rows.extend(seqs)

    def _prefill(self, seq: _Sequence) -> None:
        m = self._m
        try:
            ids = self._prompt_ids(seq)
            cache = _new_cache(m.model.config)
            logits = self._forward(torch.tensor([ids], dtype=torch.long, device=m.device),
                                   cache, None, None)
        except BackendError as exc:
            self._fail(seq, exc)
            return
        except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is one
            self._fail(seq, _model_error(exc))
            return
        self.steps += 1
        seq.length = len(ids)
        if not seq.sampling.greedy:
            seed = seq.sampling.seed
            if seed is None:
                seed = self._seeds.randrange(2**63)
            seq.generator = torch.Generator(device=m.device)
            seq.generator.manual_seed(seed % 2**64)
        self._emit(seq, int(self._pick(logits, [seq])[0]))
        if not seq.ended:
            seq.held = RowCache.from_cache(cache)
            self._add([seq])

    def _step(self) -> None:
        """One forward pass over every row: one token for each sequence."""
        rows, device = self._rows, self._m.device
        started = time.perf_counter()
        ids = torch.tensor([[s.next_id] for s in rows], dtype=torch.long, device=device)
        mask = self._batch.grow()
        positions = torch.tensor([[s.length] for s in rows], dtype=torch.long, device=device)
        try:
            if self._batched:
                logits = self._forward(ids, self._batch.cache, mask, positions)
            else:
                logits = self._forward(ids, self._batch.cache, None, None)
        except RuntimeError as exc:
            # The step's output is lost for every row: they all end, and the
            # batch's memory goes with them.
            error = _model_error(exc)
            for seq in rows:
                self._fail(seq, error)
            self._rows, self._batch = [], PaddedBatch()
            return
        self.steps += 1
        tokens = self._pick(logits, rows).tolist()  # waits for the device: the step is done
        self.timing = StepTiming(self.timing.steps + 1,
                                 self.timing.seconds + time.perf_counter() - started,
                                 self.timing.rows + len(rows))
        for seq, token in zip(rows, tokens, strict=True):
            seq.length += 1
            self._emit(seq, int(token))
        keep = [i for i, s in enumerate(rows) if not s.ended]
        self._batch.keep(keep)
        self._rows = [rows[i] for i in keep]

    def _forward(self, ids: torch.Tensor, cache: Any, mask: torch.Tensor | None,
                 positions: torch.Tensor | None) -> torch.Tensor:
        m = self._m
        kwargs: dict[str, Any] = {m.cache_arg: cache, "use_cache": True}
        if mask is not None:
            kwargs.update(attention_mask=mask, position_ids=positions)
        if m.keeps_one_logit:
            kwargs["logits_to_keep"] = 1
        logits: torch.Tensor = m.model(ids, **kwargs).logits[:, -1, :]
        return logits

    def _prompt_ids(self, seq: _Sequence) -> list[int]:
        m = self._m
        text, special = render_prompt(m.tokenizer, seq.request)
        ids: list[int] = list(m.tokenizer(text, add_special_tokens=special)["input_ids"])
        if not ids:
            raise BackendError("empty_prompt", "the prompt tokenises to nothing",
                               status="INVALID_ARGUMENT")
        seq.prompt_tokens = len(ids)
        if m.max_positions is not None:
            room = m.max_positions - len(ids)
            if room < 1:
                raise BackendError(
                    "prompt_too_long",
                    f"the prompt is {len(ids)} tokens; the model's context is {m.max_positions}",
                    status="INVALID_ARGUMENT")
            seq.max_new = min(seq.max_new, room)
        seq.detok = IncrementalDetokenizer(m.tokenizer, context_ids=ids)
        return ids

    def _pick(self, logits: torch.Tensor, rows: list[_Sequence]) -> torch.Tensor:
        """One token per row: argmax for greedy rows (all of them, in one op, when
        nobody samples), each sampled row from its own generator."""
        picked = logits.argmax(dim=-1)
        for i, seq in enumerate(rows):
            if not seq.sampling.greedy:
                picked[i] = sample(logits[i], seq.sampling, seq.generator)
        return picked

    def _emit(self, seq: _Sequence, token_id: int) -> None:
        # Counted the moment the model has produced it, before it leaves (and
        # even when a cancel arrived during this step: that is wasted work).
        seq.tracker.generated()
        self.step_tokens += 1
        seq.produced += 1
        seq.next_id = token_id
        assert seq.detok is not None
        items: list[str | _End | BackendError] = []
        if token_id in self._m.eos_ids and not self._settings.ignore_eos:
            seq.ended = True
        else:
            items.append(seq.detok.push(token_id))
            if seq.produced >= seq.max_new:
                seq.ended = seq.by_length = True
        if seq.ended:
            items += [seq.detok.flush(), _END]
        self._put(seq, [item for item in items if item != ""])

    def _fail(self, seq: _Sequence, error: BackendError) -> None:
        seq.ended = True
        seq.held = None
        self._put(seq, [error])

    def _fail_all(self, joining: list[_Sequence], error: BackendError) -> None:
        for seq in [*joining, *self._rows, *self._held]:
            if not seq.ended:
                self._fail(seq, error)
        self._rows, self._held, self._batch = [], [], PaddedBatch()
        self._deliver()

    def _put(self, seq: _Sequence, items: list[str | _End | BackendError]) -> None:
        if items:
            self._out.append((seq, items))

    def _deliver(self) -> None:
        """Hand over what the last forward pass made: one lock and one wake-up of
        the event loop for the whole batch, not one per sequence."""
        out, self._out = self._out, []
        if not out:
            return
        with self._cond:
            for seq, items in out:
                seq.ready.extend(items)
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Event]] = {}
        for seq, _ in out:
            by_loop.setdefault(seq.loop, []).append(seq.wake)
        for loop, events in by_loop.items():
            # RuntimeError: the event loop is gone (the engine is shutting down).
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_set_all, events)


def sample(logits: torch.Tensor, sampling: Sampling,
           generator: torch.Generator | None) -> torch.Tensor:
    """One token from one row's logits: softmax at the temperature, cut to the
    smallest set of tokens whose probability reaches top_p (the nucleus)."""
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1:
        ordered, order = probs.sort(descending=True)
        # Drop a token when the ones above it already reach top_p (the first always stays).
        drop = ordered.cumsum(dim=-1) - ordered >= sampling.top_p
        probs = probs.scatter(-1, order, ordered.masked_fill(drop, 0.0))
    return torch.multinomial(probs, 1, generator=generator)[0]


def _set_all(events: list[asyncio.Event]) -> None:
    for event in events:
        event.set()


def _model_error(exc: RuntimeError) -> BackendError:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        error = BackendError("out_of_memory", f"the device ran out of memory: {exc}",
                             status="RESOURCE_EXHAUSTED")
    else:
        error = BackendError("model_error", f"{type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


def _new_cache(config: Any) -> Any:
    try:
        return DynamicCache(config=config)
    except TypeError:  # transformers before the layered caches
        return DynamicCache()


class HFModel:
    """Concurrency: up to STREAMLAB_HF_MAX_BATCH generations decode together,
    one forward pass per step over all of them (the engine's admission queues
    the rest, bounded and FIFO, and refuses past the bound; a waiter whose
    caller leaves leaves the queue). A model whose KV cache cannot be padded
    and cut (sliding-window layers) decodes one at a time."""

    name = "hf"
    # Accepted at once: a queue wait or a prefill is silence the gateway covers with pings.
    defers_acceptance = False
    calls_tools = False  # no chat template with tools here: a request offering some is refused

    def __init__(self, settings: HFSettings) -> None:
        self._settings = settings
        self._loaded = load(settings)
        batched = batchable(_new_cache(self._loaded.model.config))
        self.max_concurrency: int | None = settings.max_batch if batched else 1
        if not batched and settings.max_batch > 1:
            log.warning("hf backend: %s's KV cache has layers the batch cannot pad "
                        "(sliding window?): one generation at a time", settings.model)
        self._decode = _DecodeLoop(self._loaded, settings, batched)
        log.info("hf backend: %s on %s (%s), batch up to %d", settings.model,
                 self._loaded.device, self._loaded.dtype, self.max_concurrency)

    def options(self, request: pb.GenerateRequest) -> Sampling:
        # A real model: the fake model's timing means nothing here; sampling does.
        return read_sampling(request, self._settings)

    async def generate(
        self, request: GenerationInput, options: Sampling | None, tracker: TokenTracker
    ) -> AsyncGenerator[str | GenerationSummary | Accepted, None]:
        # None (a caller without a wire request): the engine's own defaults.
        sampling = options or read_sampling(pb.GenerateRequest(), self._settings)
        seq = _Sequence(request, tracker, asyncio.get_running_loop(), sampling)
        self._decode.submit(seq)
        try:
            while not isinstance(item := await self._decode.take(seq), _End):
                if isinstance(item, BackendError):
                    raise item
                yield item
        finally:
            self._decode.close(seq)
        yield GenerationSummary(prompt_tokens=seq.prompt_tokens,
                                completion_tokens=seq.produced,
                                finished_by_length=seq.by_length)

    def finished_by_length(self, request: GenerationInput, options: Sampling | None,
                           produced: int) -> bool:
        return produced >= request.max_tokens  # not used: generate() yields a summary

    @property
    def step_timing(self) -> StepTiming:
        return self._decode.timing

    def load(self) -> BackendLoad:
        device = self._loaded.device
        memory = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        return BackendLoad(device=str(device), device_memory_allocated=memory,
                           decode_steps=self._decode.steps,
                           decode_step_tokens=self._decode.step_tokens)

    async def aclose(self) -> None:
        await self._decode.stop()
