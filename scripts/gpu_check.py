"""The transformers backend on a real device: TTFT, tokens/s, cancel→stop, memory.

Starts the engine in this process with the hf backend and drives it with a
gRPC client over TCP, as the gateway would:

  1. full generations, one after another: TTFT (request → first token) and
     decode rate (tokens/s after the first);
  2. generations cancelled after a few tokens: the time from the client's
     cancel to the engine seeing it and to the generation ending, tokens the
     model produced after the cancel, and the device memory held by tensors
     before and after (it must come back: the KV caches are freed);
  3. a burst of concurrent requests: they decode together (the backend batches
     up to STREAMLAB_HF_MAX_BATCH), the queue depth the engine reports past
     that, and TTFT including any wait.

Step time, tokens/s and cancels against the batch size: `streamlab bench gpu`
(streamlab/experiments/bench/gpu.py), which grew from this script.

With no --model it builds a model with random weights (GPT-2 small's body, a
tokenizer trained here), so nothing is downloaded. On a GPU machine:

    python scripts/gpu_check.py                          # cuda if torch sees one
    python scripts/gpu_check.py --model /models/Llama-3.2-1B-Instruct --dtype bfloat16
    python scripts/gpu_check.py --device cpu --size tiny --requests 4   # the CPU smoke test

Exit status 1 when a check fails (a token after a cancel beyond one step,
memory that did not come back, a generation that did not end).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a plain checkout

import grpc
import torch

from services.engine.random_model import SIZES, build
from services.engine.server import create_server
from services.engine.settings import EngineSettings, HFSettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc

PROMPT = "Write a long story about a café owner who counts tokens one by one."


@dataclass
class Report:
    device: str
    dtype: str
    model: str
    parameters: int
    full: list[dict[str, float]] = field(default_factory=list)
    cancels: list[dict[str, float]] = field(default_factory=list)
    burst: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


async def generate(stub: pb_grpc.EngineServiceStub, request_id: str, max_tokens: int,
                   cancel_after: int | None = None) -> dict[str, float]:
    start = time.perf_counter()
    first: float | None = None
    last = start
    chunks = tokens = 0
    call = stub.Generate(pb.GenerateRequest(request_id=request_id, prompt=PROMPT,
                                            max_tokens=max_tokens), timeout=600)
    async for response in call:
        if response.HasField("token"):
            chunks += 1
            last = time.perf_counter()
            first = first if first is not None else last
            if cancel_after is not None and chunks >= cancel_after:
                break
        elif response.HasField("finish"):
            # Model tokens, not chunks: a chunk may carry several tokens' text
            # (a character split across tokens comes out with its last byte).
            tokens = response.finish.usage.completion_tokens
    tokens = tokens or chunks
    result = {"ttft_s": (first or last) - start, "tokens": tokens}
    if cancel_after is not None:
        result["cancelled_at"] = time.monotonic()  # the clock the engine's records use
        call.cancel()
    elif first is not None and tokens > 1:
        result["decode_tok_s"] = (tokens - 1) / (last - first)
    return result


async def record(stub: pb_grpc.EngineServiceStub, request_id: str,
                 timeout_s: float = 30.0) -> pb.GenerationRecord:
    """Poll until the generation has ended; its record carries CLOCK_MONOTONIC times."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = (await stub.GetStats(pb.GetStatsRequest(request_id=request_id), timeout=5)
                 ).generations
        if found and found[0].state != pb.GENERATION_STATE_RUNNING:
            return found[0]
        await asyncio.sleep(0.001)
    raise TimeoutError(f"{request_id} did not end within {timeout_s} s")


async def device_memory(stub: pb_grpc.EngineServiceStub) -> int:
    stats = await stub.GetStats(pb.GetStatsRequest(), timeout=5)
    return int(stats.load.device_memory_allocated)


async def run(args: argparse.Namespace) -> Report:
    model_dir = args.model
    if model_dir is None:
        model_dir = build(Path(tempfile.mkdtemp(prefix="gpu-check-")) / args.size, args.size)
    settings = EngineSettings(
        host="127.0.0.1", port=0, backend="hf", max_queued_generations=max(8, args.burst),
        # ignore_eos: every full generation is max_tokens long, so runs compare.
        hf=HFSettings(model=str(model_dir), device=args.device, dtype=args.dtype,
                      ignore_eos=True))
    engine = await create_server(settings)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{engine.port}")
    stub = pb_grpc.EngineServiceStub(channel)
    try:
        stats = await stub.GetStats(pb.GetStatsRequest(), timeout=5)
        report = Report(device=stats.load.device, dtype=args.dtype, model=str(model_dir),
                        parameters=_parameters(model_dir))
        for i in range(2):  # warm-up: kernels, allocator, caches
            await generate(stub, f"warmup-{i}", 8)

        for i in range(args.requests):
            report.full.append(await generate(stub, f"full-{i}", args.max_tokens))

        cuda = report.device.startswith("cuda")
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        before = await device_memory(stub)
        for i in range(args.cancels):
            rid = f"cancel-{i}"
            sample = await generate(stub, rid, args.cancel_max_tokens,
                                    cancel_after=args.cancel_after)
            done = await record(stub, rid)
            sample.update(seen_ms=(done.cancelled_at - sample["cancelled_at"]) * 1000,
                          ended_ms=(done.ended_at - sample["cancelled_at"]) * 1000)
            if done.state != pb.GENERATION_STATE_CANCELLED:  # it finished before the cancel
                report.failures.append(f"{rid} ended {pb.GenerationState.Name(done.state)}")
            report.cancels.append(sample)
        # One short generation after the cancels: the decode thread runs in order,
        # so a step of a cancelled generation still in flight has finished by then
        # (and was counted), and its KV cache was dropped.
        await generate(stub, "after-cancels", 2)
        after = await device_memory(stub)
        for i, sample in enumerate(report.cancels):
            final = await record(stub, f"cancel-{i}")
            sample.update(tokens_generated=final.tokens_generated,
                          tokens_after_cancel=final.tokens_after_cancel)
            if final.tokens_after_cancel > 1:
                report.failures.append(
                    f"cancel-{i}: {final.tokens_after_cancel} tokens after the cancel")
        report.memory = {"before_cancels": before, "after_cancels": after,
                         "peak": torch.cuda.max_memory_allocated() if cuda else 0}
        if cuda and after > before:
            report.failures.append(f"device memory did not come back: {before} → {after} bytes")

        report.burst = await burst(stub, args.burst, args.max_tokens)
        return report
    finally:
        await channel.close()
        await engine.stop(0)


async def burst(stub: pb_grpc.EngineServiceStub, count: int, max_tokens: int) -> dict[str, Any]:
    depths: list[int] = []
    tasks = [asyncio.create_task(generate(stub, f"burst-{i}", max_tokens)) for i in range(count)]
    while not all(t.done() for t in tasks):
        stats = await stub.GetStats(pb.GetStatsRequest(), timeout=5)
        depths.append(stats.load.queue_waiting)
        await asyncio.sleep(0.01)
    ttfts = [t.result()["ttft_s"] for t in tasks]
    return {"requests": count, "max_queue_waiting": max(depths, default=0),
            "ttft_s_min": min(ttfts), "ttft_s_max": max(ttfts)}


def _parameters(model_dir: Path | str) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):  # counts without allocating
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


def summary(report: Report) -> str:
    def p(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]

    ttft = [s["ttft_s"] * 1000 for s in report.full]
    rate = [s["decode_tok_s"] for s in report.full if "decode_tok_s" in s]
    seen = [s["seen_ms"] for s in report.cancels]
    ended = [s["ended_ms"] for s in report.cancels]
    after = [s["tokens_after_cancel"] for s in report.cancels]
    mib = {k: v / 2**20 for k, v in report.memory.items()}
    lines = [
        f"model   {report.model} ({report.parameters / 1e6:.2f} M parameters) "
        f"on {report.device}, dtype {report.dtype}",
        f"TTFT    p50 {p(ttft, 50):.1f} ms · p95 {p(ttft, 95):.1f} ms "
        f"({len(ttft)} requests)",
        f"decode  p50 {p(rate, 50):.0f} tok/s · min {min(rate):.0f} tok/s",
        f"cancel  seen by the engine p50 {p(seen, 50):.2f} ms · generation ended p50 "
        f"{p(ended, 50):.2f} ms, max {max(ended):.2f} ms (+ at most the decode step in "
        f"flight, ~{1000 / p(rate, 50):.1f} ms) · tokens after cancel max {max(after):.0f} "
        f"({len(seen)} cancels)",
        f"memory  before cancels {mib['before_cancels']:.1f} MiB · after "
        f"{mib['after_cancels']:.1f} MiB · peak {mib['peak']:.1f} MiB"
        if report.device.startswith("cuda") else "memory  (CPU: not measured)",
        f"burst   {report.burst['requests']} at once: queue depth up to "
        f"{report.burst['max_queue_waiting']} · TTFT {report.burst['ttft_s_min'] * 1000:.0f}"
        f"–{report.burst['ttft_s_max'] * 1000:.0f} ms",
    ]
    lines += [f"FAIL    {f}" for f in report.failures] or ["checks  passed"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto, cuda, cuda:1, cpu")
    parser.add_argument("--dtype", default="auto",
                        choices=["auto", "bfloat16", "float16", "float32"])
    parser.add_argument("--model", type=Path, default=None,
                        help="a model directory (save_pretrained); default: random weights")
    parser.add_argument("--size", choices=sorted(SIZES), default="gpt2-small",
                        help="the random model's size when no --model is given")
    parser.add_argument("--requests", type=int, default=24, help="full generations")
    parser.add_argument("--cancels", type=int, default=24, help="cancelled generations")
    parser.add_argument("--cancel-after", type=int, default=8, help="tokens before a cancel")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per full generation")
    parser.add_argument("--cancel-max-tokens", type=int, default=512,
                        help="what a cancelled generation asks for: far more than it gets")
    parser.add_argument("--burst", type=int, default=4, help="concurrent requests at the end")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    print(summary(report))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
