"""`streamlab bench gpu`: the hf backend on its device, at several batch sizes.

Starts an engine with the hf backend in this process (STREAMLAB_HF_MAX_BATCH
= the largest batch asked for) and drives it over gRPC, as the gateway would.
For each batch size B:

  decode   B generations started at once, `max_tokens` each: tokens/s over
           the whole batch (all tokens / wall time), TTFT, the model's step
           time (the decode thread's own clock around each batched step, and
           the rows it served on average), the gap between one stream's tokens
           as its reader sees it (the step, plus the engine's and this
           client's work on the event loop), and the mean batch the engine saw
           (GetStats: tokens / forward passes, prefills included);
  cancel   B long generations; once each has `cancel_after` tokens, one is
           cancelled while the others run (the time until the engine saw it
           and until its generation ended, and the tokens its model made
           after the cancel, read once the others made two more steps), then
           the rest; device memory (bytes held by tensors) before, at the peak
           and after: it must come back.

A check fails (exit 1 from the command) when a cancel let more than one token
through, a cancelled generation ended some other way, memory did not come back
on a GPU, or the engine runs fewer at once than the largest batch; a
generation that does not end at all stops the bench.
Imports torch: the command imports this module only when it runs.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import grpc
import torch

from services.engine.backends.hf import HFModel
from services.engine.random_model import build
from services.engine.server import create_server
from services.engine.settings import EngineSettings, HFSettings
from streamlab.experiments.report import Check, Figure, Figures, Report, Table, judge
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc

PROMPTS = [
    "Write a long story about a café owner who counts tokens one by one.",
    "Explain how a KV cache works.",
    "List the planets.",
    "Tell me about Tokyo (東京) at night.",
]
# Tokens the other rows make after a cancel before its record is read: the
# step in flight when it came has finished by then.
STEPS_AFTER_CANCEL = 2
DType = Literal["auto", "float32", "bfloat16", "float16"]


@dataclass(frozen=True)
class GpuBenchOptions:
    model: str | None = None  # a save_pretrained directory; None: random weights of `size`
    size: str = "tiny"
    device: str = "auto"
    dtype: DType = "auto"
    batches: tuple[int, ...] = (1, 8, 32)
    max_tokens: int = 64
    cancel_after: int = 4
    cancel_max_tokens: int = 2000
    cpu_threads: int = 0


@dataclass
class BatchFigures:
    batch: int
    tokens: int
    tokens_per_s: float
    ttft_ms_p50: float
    ttft_ms_max: float
    model_step_ms: float
    rows_per_step: float
    token_gap_ms: float
    mean_batch: float
    cancel: CancelFigures

    def report(self, cuda: bool) -> Report:
        """The batch's figures, judged: each cancel stops its generation within a
        token, every one ends cancelled, and (on a GPU) the memory comes back."""
        figures: Figures = {k: v for k, v in asdict(self).items() if k != "cancel"}
        figures.update(asdict(self.cancel))
        figures["memory_kept"] = (self.cancel.memory_after - self.cancel.memory_before
                                  if cuda else None)
        checks = [Check("tokens_after_cancel_max", "<=", 1,
                        "a cancel lets at most the step in flight through"),
                  Check("not_cancelled", "==", 0, "every cancelled generation ends cancelled")]
        if cuda:
            checks.append(Check("memory_kept", "<=", 0, "device memory comes back after the "
                                "cancels (bytes held by tensors)"))
        return Report("bench gpu", f"batch {self.batch}", figures=figures,
                      checks=judge(checks, figures))


@dataclass
class CancelFigures:
    cancel_seen_ms: float
    cancel_ended_ms: float
    tokens_after_cancel_one: int  # the one cancelled while the others ran
    tokens_after_cancel_max: int  # over all B cancelled generations
    not_cancelled: int  # of the B, ended some other way than cancelled
    memory_before: int
    memory_peak: int
    memory_after: int


@dataclass
class GpuRun:
    device: str
    dtype: str
    model: str
    parameters: int
    max_batch: int  # the engine's running limit
    rows: list[BatchFigures] = field(default_factory=list)

    def row(self, batch: int) -> BatchFigures:
        return next(r for r in self.rows if r.batch == batch)

    def report(self, asked_batch: int) -> Report:
        cuda = self.device.startswith("cuda")
        figures: Figures = {"device": self.device, "dtype": self.dtype, "model": self.model,
                            "parameters": self.parameters, "max_batch": self.max_batch}
        checks = (Check("max_batch", ">=", asked_batch, "the engine runs the largest batch "
                        "asked for at once (a model the batch cannot pad would not)"),)
        return Report(
            "bench gpu", story=f"{self.model} ({self.parameters / 1e6:.2f} M parameters) on "
            f"{self.device}, dtype {self.dtype}", figures=figures,
            checks=judge(checks, figures),
            tables=(Table("batches", COLUMNS, tuple(_row(r, cuda) for r in self.rows)),),
            parts=tuple(r.report(cuda) for r in self.rows))


async def run_gpu_bench(options: GpuBenchOptions) -> Report:
    run = await measure_gpu(options)
    return run.report(max(options.batches))


async def measure_gpu(options: GpuBenchOptions) -> GpuRun:
    model_dir = options.model or str(
        build(Path(tempfile.mkdtemp(prefix="bench-gpu-")) / options.size, options.size))
    max_batch = max(options.batches)
    settings = EngineSettings(
        host="127.0.0.1", port=0, backend="hf", max_running_generations=max_batch,
        max_queued_generations=max_batch,
        # ignore_eos: every generation is max_tokens long, so batch sizes compare.
        hf=HFSettings(model=model_dir, device=options.device, dtype=options.dtype,
                      ignore_eos=True, max_batch=max_batch, cpu_threads=options.cpu_threads))
    # Built here, not by create_server, to read the decode thread's step clock.
    backend = await asyncio.to_thread(HFModel, settings.hf)
    engine = await create_server(settings, backend)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{engine.port}")
    stub = pb_grpc.EngineServiceStub(channel)
    try:
        load = (await _stats(stub)).load
        run = GpuRun(device=load.device, dtype=options.dtype, model=model_dir,
                     parameters=_parameters(model_dir), max_batch=load.running_limit)
        await _decode(stub, "warmup", 2, 4)  # kernels, allocator, caches
        for batch in options.batches:
            run.rows.append(await _batch_row(stub, backend, options, batch, run.device))
        return run
    finally:
        await channel.close()
        await engine.stop(0)
        await backend.aclose()


async def _batch_row(stub: pb_grpc.EngineServiceStub, backend: HFModel,
                     options: GpuBenchOptions, batch: int, device: str) -> BatchFigures:
    before, clock = (await _stats(stub)).load, backend.step_timing
    start = time.perf_counter()
    streams = await _decode(stub, f"b{batch}", batch, options.max_tokens)
    wall = time.perf_counter() - start
    after, ticked = (await _stats(stub)).load, backend.step_timing
    batched = ticked.steps - clock.steps
    tokens = sum(s.tokens for s in streams)
    gaps = [statistics.median(s.gaps) for s in streams if s.gaps]
    ttfts = [s.ttft_s * 1000 for s in streams]
    steps = after.decode_steps - before.decode_steps
    cancel = await _cancels(stub, options, batch, device)
    return BatchFigures(
        batch=batch, tokens=tokens, tokens_per_s=round(tokens / wall, 1),
        ttft_ms_p50=round(statistics.median(ttfts), 1), ttft_ms_max=round(max(ttfts), 1),
        model_step_ms=round((ticked.seconds - clock.seconds) / batched * 1000, 2)
        if batched else float("nan"),
        rows_per_step=round((ticked.rows - clock.rows) / batched, 2) if batched else 0.0,
        token_gap_ms=round(statistics.median(gaps) * 1000, 2) if gaps else float("nan"),
        mean_batch=round((after.decode_step_tokens - before.decode_step_tokens) / steps, 2)
        if steps else 0.0,
        cancel=cancel)


@dataclass
class _Stream:
    ttft_s: float = 0.0
    tokens: int = 0
    gaps: list[float] = field(default_factory=list)


async def _decode(stub: pb_grpc.EngineServiceStub, tag: str, count: int,
                  max_tokens: int) -> list[_Stream]:
    return await asyncio.gather(*(_one(stub, f"{tag}-{i}", PROMPTS[i % len(PROMPTS)],
                                       max_tokens) for i in range(count)))


async def _one(stub: pb_grpc.EngineServiceStub, request_id: str, prompt: str,
               max_tokens: int) -> _Stream:
    stream = _Stream()
    start = last = time.perf_counter()
    async for response in stub.Generate(pb.GenerateRequest(
            request_id=request_id, prompt=prompt, max_tokens=max_tokens), timeout=600):
        if response.HasField("token"):
            now = time.perf_counter()
            if stream.ttft_s == 0.0:
                stream.ttft_s = now - start
            else:
                stream.gaps.append(now - last)
            last = now
        elif response.HasField("finish"):
            # Model tokens, not chunks: a chunk may hold several tokens' text.
            stream.tokens = response.finish.usage.completion_tokens
    return stream


async def _cancels(stub: pb_grpc.EngineServiceStub, options: GpuBenchOptions, batch: int,
                   device: str) -> CancelFigures:
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    memory_before = (await _stats(stub)).load.device_memory_allocated
    ids = [f"c{batch}-{i}" for i in range(batch)]
    calls = [stub.Generate(pb.GenerateRequest(request_id=rid, prompt=PROMPTS[i % len(PROMPTS)],
                                              max_tokens=options.cancel_max_tokens),
                           timeout=600) for i, rid in enumerate(ids)]
    counts = [0] * batch
    enough = [asyncio.Event() for _ in ids]
    ticks = [asyncio.Event() for _ in ids]  # set at each of a stream's tokens
    readers = [asyncio.create_task(_count(call, counts, enough, ticks, i, options.cancel_after))
               for i, call in enumerate(calls)]
    try:
        await asyncio.gather(*(e.wait() for e in enough))
        readers[0].cancel()
        calls[0].cancel()
        cancelled_at = time.monotonic()  # the clock the engine's records use
        ended = await _ended_record(stub, ids[0])
        if batch > 1:  # the others step on; the step in flight at the cancel is done
            seen = counts[1]
            while counts[1] < seen + STEPS_AFTER_CANCEL and not readers[1].done():
                ticks[1].clear()
                await asyncio.wait_for(ticks[1].wait(), timeout=60)
        one = await _ended_record(stub, ids[0])
    finally:
        for call, reader in zip(calls, readers, strict=True):
            reader.cancel()
            call.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    await _decode(stub, f"after-c{batch}", 1, 2)  # steps in flight at the cancels are done
    records = [await _ended_record(stub, rid) for rid in ids]
    memory_after = (await _stats(stub)).load.device_memory_allocated
    return CancelFigures(
        cancel_seen_ms=round((ended.cancelled_at - cancelled_at) * 1000, 2),
        cancel_ended_ms=round((ended.ended_at - cancelled_at) * 1000, 2),
        tokens_after_cancel_one=one.tokens_after_cancel,
        tokens_after_cancel_max=max(r.tokens_after_cancel for r in records),
        not_cancelled=sum(1 for r in records if r.state != pb.GENERATION_STATE_CANCELLED),
        memory_before=memory_before,
        memory_peak=torch.cuda.max_memory_allocated() if cuda else 0,
        memory_after=memory_after)


async def _count(call: AsyncIterator[pb.GenerateResponse], counts: list[int],
                 enough: list[asyncio.Event], ticks: list[asyncio.Event], index: int,
                 after: int) -> None:
    async for response in call:
        if response.HasField("token"):
            counts[index] += 1
            ticks[index].set()
            if counts[index] >= after:
                enough[index].set()


async def _stats(stub: pb_grpc.EngineServiceStub, request_id: str = "") -> pb.GetStatsResponse:
    response: pb.GetStatsResponse = await stub.GetStats(
        pb.GetStatsRequest(request_id=request_id), timeout=5)
    return response


async def _ended_record(stub: pb_grpc.EngineServiceStub, request_id: str,
                        timeout_s: float = 30.0) -> pb.GenerationRecord:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = (await _stats(stub, request_id)).generations
        if found and found[0].state != pb.GENERATION_STATE_RUNNING:
            return found[0]
        await asyncio.sleep(0.001)
    raise TimeoutError(f"{request_id} did not end within {timeout_s} s")


def _parameters(model_dir: str) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):  # counts without allocating
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


COLUMNS = ("batch", "tokens/s", "TTFT p50 ms", "TTFT max ms", "model step ms", "rows/step",
           "token gap ms", "mean batch",
           "cancel seen ms", "cancel ended ms", "tokens after cancel: one", "max",
           "memory before MiB", "peak", "after")


def _row(r: BatchFigures, cuda: bool) -> tuple[Figure, ...]:
    def mib(n: int) -> float:
        return round(n / 2**20, 1)

    c = r.cancel
    return (r.batch, round(r.tokens_per_s), r.ttft_ms_p50, r.ttft_ms_max, r.model_step_ms,
            r.rows_per_step, r.token_gap_ms, r.mean_batch, c.cancel_seen_ms, c.cancel_ended_ms,
            c.tokens_after_cancel_one, c.tokens_after_cancel_max,
            *((mib(c.memory_before), mib(c.memory_peak), mib(c.memory_after)) if cuda
              else (None, None, None)))
