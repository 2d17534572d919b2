"""The transformers backend behind the engine's real gRPC server, on a tiny model
built here: what it decodes, how it detokenises, how it stops, how it queues."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from services.engine.settings import EngineSettings, HFSettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.engine_inproc import record, running_engine, stats
from tests.integration.hf_fixtures import LONG_ANSWER
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def hf_settings(model_dir: Path, queued: int = 8, **hf: Any) -> EngineSettings:
    return EngineSettings(backend="hf", max_queued_generations=queued,
                          hf=HFSettings(model=str(model_dir), cpu_threads=1, **hf))


async def test_the_stream_is_what_transformers_generate_decodes(tiny_model_dir: Path) -> None:
    """Our KV-cache loop and detokeniser against the library's own greedy generate()."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompt, budget = "the quick brown fox", 24
    texts: list[str] = []
    finish: pb.Finish | None = None
    async with running_engine(hf_settings(tiny_model_dir)) as stub:
        async for response in stub.Generate(pb.GenerateRequest(prompt=prompt, max_tokens=budget),
                                            timeout=60):
            if response.HasField("token"):
                texts.append(response.token.text)
            elif response.HasField("finish"):
                finish = response.finish

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=budget, do_sample=False,
                         pad_token_id=tokenizer.eos_token_id)
    new = out[0, ids.shape[1]:].tolist()
    assert finish is not None
    assert "".join(texts) == tokenizer.decode(new, skip_special_tokens=True)
    assert finish.usage.prompt_tokens == ids.shape[1]
    assert finish.usage.completion_tokens == len(new)
    expected = pb.FINISH_REASON_LENGTH if len(new) == budget else pb.FINISH_REASON_STOP
    assert finish.reason == expected


async def test_a_stop_sequence_ends_a_real_models_answer_there(tiny_model_dir: Path) -> None:
    """The engine's stop matcher over real tokenizer output: the text is cut
    before the stop, and decoding stops at the token that completed it."""
    prompt, budget = "the quick brown fox", 24

    async def generate(stop: list[str]) -> tuple[str, pb.Finish | None]:
        texts: list[str] = []
        finish: pb.Finish | None = None
        async with running_engine(hf_settings(tiny_model_dir)) as stub:
            async for response in stub.Generate(
                    pb.GenerateRequest(prompt=prompt, max_tokens=budget, stop=stop), timeout=60):
                if response.HasField("token"):
                    texts.append(response.token.text)
                elif response.HasField("finish"):
                    finish = response.finish
        return "".join(texts), finish

    full, _ = await generate([])
    stop = full[len(full) // 2: len(full) // 2 + 2]  # two characters from the middle
    assert len(stop) == 2, f"the tiny model said too little: {full!r}"
    cut, finish = await generate([stop])
    assert cut == full[: full.find(stop)]
    assert finish is not None
    assert finish.reason == pb.FINISH_REASON_STOP
    assert finish.usage.completion_tokens < budget


def test_multibyte_text_round_trips_through_the_real_tokenizer(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from services.engine.backends.detokenize import REPLACEMENT, IncrementalDetokenizer
    from services.engine.random_model import PASSAGE

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer(PASSAGE, add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push(i) for i in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == PASSAGE
    assert not any(REPLACEMENT in p for p in pieces)
    # The BPE split some character across tokens, and the detokeniser held it back.
    assert "" in pieces[:-1]


async def test_a_cancel_stops_decoding_at_the_next_step(tiny_model_dir: Path) -> None:
    async with running_engine(hf_settings(tiny_model_dir, ignore_eos=True)) as stub:
        call = stub.Generate(pb.GenerateRequest(request_id="leaver", prompt="write",
                                                max_tokens=LONG_ANSWER), timeout=60)
        received = 0
        async for _ in call:
            received += 1
            if received == 5:
                break
        call.cancel()
        await wait_until_async(lambda: _ended(stub, "leaver"), timeout_s=10,
                               what="the cancel reaches the engine", interval_s=0.01)
        at_end = await record(stub, "leaver")

        # One decode thread: once a later generation is done, any step of the
        # cancelled one still in flight has finished.
        async for _ in stub.Generate(pb.GenerateRequest(request_id="next", prompt="hi",
                                                        max_tokens=3), timeout=60):
            pass
        final = await record(stub, "leaver")

    assert final.state == pb.GENERATION_STATE_CANCELLED
    assert final.tokens_after_cancel <= 1
    assert final.tokens_generated - at_end.tokens_generated <= 1
    assert final.tokens_generated < LONG_ANSWER
    assert final.tokens_generated >= received


async def test_one_decodes_one_waits_one_is_refused_and_a_cancelled_waiter_leaves(
    tiny_model_dir: Path
) -> None:
    # A batch of one: the running limit is the backend's STREAMLAB_HF_MAX_BATCH.
    settings = hf_settings(tiny_model_dir, queued=1, ignore_eos=True, max_batch=1)
    async with running_engine(settings) as stub:
        running = stub.Generate(pb.GenerateRequest(request_id="running", prompt="a",
                                                    max_tokens=LONG_ANSWER), timeout=60)
        await running.read()  # the first token: it holds the model
        waiter = stub.Generate(pb.GenerateRequest(request_id="waiter", prompt="b",
                                                  max_tokens=5), timeout=60)
        await waiter.initial_metadata()
        await wait_until_async(lambda: _queue_is(stub, 1), timeout_s=10,
                               what="the second request waits in the queue", interval_s=0.01)

        refused = stub.Generate(pb.GenerateRequest(prompt="c", max_tokens=5), timeout=60)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await refused.read()
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        load = (await stats(stub)).load
        assert (load.running, load.running_limit, load.queue_limit) == (1, 1, 1)
        assert load.device == "cpu"
        waiter.cancel()
        await wait_until_async(lambda: _queue_is(stub, 0), timeout_s=10,
                               what="the cancelled waiter leaves the queue", interval_s=0.01)
        # It never reached the model: no generation was started for it.
        assert not (await stats(stub, "waiter")).generations
        assert (await record(stub, "running")).state == pb.GENERATION_STATE_RUNNING
        running.cancel()


async def _queue_is(stub: Any, depth: int) -> bool:
    return bool((await stats(stub)).load.queue_waiting == depth)


async def _ended(stub: Any, request_id: str) -> bool:
    return bool((await record(stub, request_id)).state != pb.GENERATION_STATE_RUNNING)
