"""Continuous batching in the transformers backend, behind the engine's real gRPC
server, on the tiny model: generations share forward passes, a new one joins
between steps, a cancelled one leaves before the next step, and a sequence
decodes the same text in a batch as alone."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from services.engine.settings import EngineSettings, HFSettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc
from tests.integration.engine_inproc import record, running_engine, stats
from tests.integration.hf_fixtures import LONG_ANSWER
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

# Prompts of different lengths: the batch pads them on the left.
PROMPTS = ["the quick brown fox", "hi", "write about cafés in 東京", "a",
           "tell me a story about a naïve owner", "x y z", "one two three four five", "q"]


def batch_settings(model_dir: Path, max_batch: int = 8) -> EngineSettings:
    return EngineSettings(backend="hf", max_queued_generations=8,
                          hf=HFSettings(model=str(model_dir), cpu_threads=1, ignore_eos=True,
                                        max_batch=max_batch))


async def generate(stub: pb_grpc.EngineServiceStub, request_id: str, prompt: str,
                   max_tokens: int) -> tuple[str, pb.Finish]:
    texts: list[str] = []
    async for response in stub.Generate(pb.GenerateRequest(
            request_id=request_id, prompt=prompt, max_tokens=max_tokens), timeout=120):
        if response.HasField("token"):
            texts.append(response.token.text)
        elif response.HasField("finish"):
            return "".join(texts), response.finish
    raise AssertionError(f"{request_id} ended without a finish")


async def test_eight_generations_share_steps_and_decode_what_each_decodes_alone(
    tiny_model_dir: Path
) -> None:
    budget = 12
    async with running_engine(batch_settings(tiny_model_dir)) as stub:
        assert (await stats(stub)).load.running_limit == 8
        alone = [await generate(stub, f"alone-{i}", p, budget) for i, p in enumerate(PROMPTS)]
        before = (await stats(stub)).load
        together = await asyncio.gather(*(generate(stub, f"together-{i}", p, budget)
                                          for i, p in enumerate(PROMPTS)))
        after = (await stats(stub)).load

    # Greedy decoding: padding and the mask change nothing in any row's text.
    assert [text for text, _ in together] == [text for text, _ in alone]
    assert all(f.usage.completion_tokens == budget for _, f in together)
    steps = after.decode_steps - before.decode_steps
    tokens = after.decode_step_tokens - before.decode_step_tokens
    assert tokens == budget * len(PROMPTS)
    # Alone, every token is a forward pass of its own (8 x 12 = 96); together,
    # one step serves every running row: at least a prefill per prompt, and far
    # fewer passes than tokens.
    assert len(PROMPTS) + budget - 1 <= steps < tokens // 2, (steps, tokens)


async def test_a_generation_started_while_others_run_joins_without_waiting(
    tiny_model_dir: Path
) -> None:
    async with running_engine(batch_settings(tiny_model_dir, max_batch=3)) as stub:
        longs = [stub.Generate(pb.GenerateRequest(request_id=f"long-{i}", prompt=p,
                                                  max_tokens=LONG_ANSWER), timeout=120)
                 for i, p in enumerate(PROMPTS[:2])]
        for call in longs:
            await call.read()  # both are decoding
        text, finish = await generate(stub, "joiner", "join us", 5)
        # It finished while both long ones were still decoding: it shared their steps.
        assert finish.usage.completion_tokens == 5
        assert text
        for i in range(2):
            assert (await record(stub, f"long-{i}")).state == pb.GENERATION_STATE_RUNNING
        assert (await stats(stub)).load.queue_waiting == 0
        for call in longs:
            call.cancel()


async def test_a_cancelled_sequence_leaves_the_batch_within_one_step(tiny_model_dir: Path) -> None:
    async with running_engine(batch_settings(tiny_model_dir)) as stub:
        calls = [stub.Generate(pb.GenerateRequest(request_id=f"row-{i}", prompt=p,
                                                  max_tokens=LONG_ANSWER), timeout=120)
                 for i, p in enumerate(PROMPTS)]
        counts = [0] * len(calls)
        readers = [asyncio.create_task(_read(call, counts, i)) for i, call in enumerate(calls)]
        try:
            await wait_until_async(lambda: min(counts) >= 3, timeout_s=10, what="all eight decode",
                                   interval_s=0.01)
            leaver = readers[0]
            leaver.cancel()
            calls[0].cancel()
            await wait_until_async(lambda: _ended(stub, "row-0"), timeout_s=10,
                                   what="the cancel reaches the engine", interval_s=0.01)
            at_end = await record(stub, "row-0")
            # The batch goes on without it: four more steps for every other row.
            seen = counts[1]
            await wait_until_async(lambda: counts[1] >= seen + 4, timeout_s=10,
                                   what="the others keep decoding", interval_s=0.01)
            final = await record(stub, "row-0")
            others = [await record(stub, f"row-{i}") for i in range(1, len(calls))]
        finally:
            for call, reader in zip(calls, readers, strict=True):
                reader.cancel()
                call.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

    assert final.state == pb.GENERATION_STATE_CANCELLED
    assert final.tokens_after_cancel <= 1
    # At most the step in flight when it ended, though four more steps ran.
    assert final.tokens_generated - at_end.tokens_generated <= 1
    assert all(r.state == pb.GENERATION_STATE_RUNNING for r in others)


async def _read(call: Any, counts: list[int], index: int) -> None:
    async for response in call:
        if response.HasField("token"):
            counts[index] += 1


async def _ended(stub: Any, request_id: str) -> bool:
    return bool((await record(stub, request_id)).state != pb.GENERATION_STATE_RUNNING)


class _Counter:
    """The engine's TokenTracker, reduced to what it counts."""

    def __init__(self) -> None:
        self.count = 0

    def generated(self) -> None:
        self.count += 1


async def test_a_reader_that_stops_reading_holds_only_its_own_sequence(
    tiny_model_dir: Path
) -> None:
    """The backend without gRPC in front (whose buffers would take thousands of
    tokens to fill): a consumer that stops taking tokens parks its row once its
    ready queue is full; the other row decodes on alone, and the parked one
    comes back when its reader reads again."""
    from services.engine.backends.base import GenerationInput
    from services.engine.backends.hf import MAX_READY, HFModel

    backend = await asyncio.to_thread(HFModel, HFSettings(
        model=str(tiny_model_dir), cpu_threads=1, ignore_eos=True, max_batch=2))
    slow, fast = _Counter(), _Counter()
    stalled = backend.generate(GenerationInput("slow", "a", (), max_tokens=LONG_ANSWER), None,
                               slow)
    try:
        await anext(stalled)  # it decodes; then its reader stops
        budget = 40
        async with contextlib.aclosing(backend.generate(
                GenerationInput("fast", "b", (), max_tokens=budget), None, fast)) as running:
            async for _ in running:
                pass
        assert fast.count == budget
        # Without the hold it would have made a token at each of fast's steps.
        # With it: what fills its ready queue (a token whose text the
        # detokeniser holds back fills nothing), then nothing.
        held = slow.count
        assert held <= 1 + MAX_READY + 4, held
        resumed = 0
        async for _ in stalled:  # reading again: it rejoins and decodes
            resumed += 1
            if resumed == MAX_READY + 10:
                break
        assert slow.count > held
    finally:
        await stalled.aclose()
        await backend.aclose()
