"""The transformers backend honours the request's sampling options: greedy at
temperature 0 (or none given), seeded sampling above it, per sequence even when
sequences share a batch. On the tiny random model built here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from services.engine.settings import EngineSettings, HFSettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc
from tests.integration.engine_inproc import running_engine

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

PROMPT, BUDGET = "the quick brown fox", 24


def settings(model_dir: Path) -> EngineSettings:
    # Decode to the budget: a random model may say end-of-sequence at any step,
    # and two short texts would prove little.
    return EngineSettings(backend="hf", max_queued_generations=8,
                          hf=HFSettings(model=str(model_dir), cpu_threads=1, max_batch=2,
                                        ignore_eos=True))


async def generate(stub: pb_grpc.EngineServiceStub, **sampling: Any) -> str:
    request = pb.GenerateRequest(prompt=PROMPT, max_tokens=BUDGET)
    if sampling:
        request.sampling.CopyFrom(pb.SamplingOptions(**sampling))
    texts = []
    async for response in stub.Generate(request, timeout=60):
        if response.HasField("token"):
            texts.append(response.token.text)
        elif response.HasField("tokens"):
            texts += [chunk.text for chunk in response.tokens.chunks]
    return "".join(texts)


async def test_temperature_zero_is_greedy_and_a_seed_replays_a_sampled_answer(
        tiny_model_dir: Path) -> None:
    async with running_engine(settings(tiny_model_dir)) as stub:
        greedy = await generate(stub)
        assert await generate(stub, temperature=0.0, seed=5) == greedy
        seeded = await generate(stub, temperature=1.0, seed=5)
        assert await generate(stub, temperature=1.0, seed=5) == seeded
        assert seeded != greedy
        assert await generate(stub, temperature=1.0, seed=6) != seeded
        # top_p that small leaves only the likeliest token: greedy again.
        assert await generate(stub, temperature=1.0, top_p=1e-9, seed=5) == greedy


async def test_each_sequence_in_a_batch_samples_with_its_own_seed(tiny_model_dir: Path) -> None:
    async with running_engine(settings(tiny_model_dir)) as stub:
        alone = {seed: await generate(stub, temperature=1.0, seed=seed) for seed in (1, 2)}
        greedy = await generate(stub)
        together: dict[str, str] = {}

        async def one(key: str, **sampling: Any) -> None:
            together[key] = await generate(stub, **sampling)

        async with anyio.create_task_group() as tasks:  # two decode together, one waits
            tasks.start_soon(lambda: one("1", temperature=1.0, seed=1))
            tasks.start_soon(lambda: one("2", temperature=1.0, seed=2))
            tasks.start_soon(lambda: one("greedy"))
    assert together == {"1": alone[1], "2": alone[2], "greedy": greedy}
