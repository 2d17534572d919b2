"""Every way a client can leave ends the generation at the engine; the broken
variants (nginx ignoring the abort, a detached relay) show the GPU writing for
nobody. Cancel latency is measured on CLOCK_MONOTONIC, which the engine's
records share with this process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest

from services.client.openai_stream import chat_body, stream_chat
from streamlab.lab.local import Lab
from streamlab.lab.toxiproxy import Toxic
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.engine_probe import wait_for_generation_end
from tests.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GAP_MS, ANSWER = 20, 60  # 1.2 s of tokens: long enough to leave, short for broken runs


def completions(lab: Lab, location: str = "/") -> str:
    return f"{lab.edge_url}{location.rstrip('/')}/v1/chat/completions"


def body(**extra: Any) -> dict[str, Any]:
    return chat_body("write an essay", prefill_ms=50, token_gap_ms=GAP_MS, answer_tokens=ANSWER,
                     **extra)


# Each way of leaving returns the monotonic time at which the client left.
Leave = Callable[[Lab, httpx.AsyncClient, str], Awaitable[float]]


async def close_after_three_tokens(lab: Lab, http: httpx.AsyncClient, rid: str) -> float:
    result = await stream_chat(http, completions(lab), body(), headers={"X-Request-Id": rid},
                               stop_after_tokens=3)
    assert result.left_at is not None
    return result.left_at


async def client_side_timeout(lab: Lab, http: httpx.AsyncClient, rid: str) -> float:
    deadline = time.monotonic() + 0.3
    with anyio.move_on_at(anyio.current_time() + 0.3):
        await stream_chat(http, completions(lab), body(), headers={"X-Request-Id": rid})
    return deadline


def reset_peer_on(hop: str) -> Leave:
    async def leave(lab: Lab, http: httpx.AsyncClient, rid: str) -> float:
        third = anyio.Event()
        seen: list[str] = []

        def on_token(text: str) -> None:
            seen.append(text)
            if len(seen) == 3:
                third.set()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(lambda: stream_chat(http, completions(lab), body(),
                                                 headers={"X-Request-Id": rid},
                                                 on_token=on_token))
            with anyio.fail_after(5):
                await third.wait()
            client = lab.toxiproxy()
            try:
                # Every hop of the kind: with replicas the stream may use any.
                for each in lab.hops_of(hop):
                    client.add_toxic(each, Toxic("reset_peer", {"timeout": 0}))
            finally:
                client.close()
            left_at = time.monotonic()
        return left_at

    return leave


@dataclass(frozen=True)
class Leaving:
    name: str
    leave: Leave


LEAVING = [
    Leaving("close-at-edge", close_after_three_tokens),
    Leaving("client-timeout", client_side_timeout),
    Leaving("reset-peer-edge", reset_peer_on("edge")),
    Leaving("reset-peer-upstream", reset_peer_on("upstream")),
]


@pytest.mark.parametrize("way", LEAVING, ids=lambda w: w.name)
async def test_leaving_cancels_the_generation(lab: Lab, http: httpx.AsyncClient,
                                              way: Leaving) -> None:
    rid = f"{way.name}-{uuid.uuid4().hex[:8]}"
    left_at = await way.leave(lab, http, rid)
    record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, rid)

    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert record.tokens_after_cancel <= 1
    assert record.tokens_generated < ANSWER
    latency = record.cancelled_at - left_at
    print(f"{way.name}: cancel seen {latency * 1000:.0f} ms after the client left, "
          f"{record.tokens_generated}/{ANSWER} tokens generated")
    assert latency < 2.0


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_in_streamlab_chat_cancels_the_generation(lab: Lab) -> None:
    rid = f"ctrl-c-{uuid.uuid4().hex[:8]}"
    chat = subprocess.Popen(
        [sys.executable, "-m", "streamlab.cli", "chat", "write", "--run-dir", str(lab.run_dir),
         "--tokens", str(ANSWER), "--gap-ms", str(GAP_MS), "--request-id", rid],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200"},
        # Ctrl-C as a terminal delivers it: to a CLI whose SIGINT is the default. A
        # suite started in the background (`make test &`) runs with SIGINT ignored,
        # which a child inherits and Python then leaves ignored.
        preexec_fn=_sigint_as_in_a_terminal,
    )
    try:
        def generating() -> bool:
            records = lab.engine_stats(rid).generations
            return bool(records) and records[0].tokens_generated >= 2
        wait_until(generating, timeout_s=30,  # a CLI start on a busy machine
                   interval_s=0.02, what="streamlab chat's generation under way")
        chat.send_signal(signal.SIGINT)
        left_at = time.monotonic()
        assert chat.wait(timeout=10) == 130
    finally:
        chat.kill()
        chat.wait()
        if chat.stdout is not None:
            chat.stdout.close()
    record = wait_for_generation_end(lab, rid)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert record.tokens_after_cancel <= 1
    assert record.cancelled_at - left_at < 2.0


async def test_detached_relay_generates_to_the_end_for_nobody(
    lab: Lab, http: httpx.AsyncClient
) -> None:
    """The classic anti-pattern: generation in a task nobody cancels, feeding an
    unbounded queue. The client leaves after 3 tokens; the engine writes all 60.

    (nginx's `proxy_ignore_client_abort on` was the other broken variant we
    tried: nginx 1.22 still closes the upstream on the first failed write to
    the client for a response it neither caches nor stores, so it only delays
    the cancel to the next token or ping; it does not leak the generation.)"""
    rid = f"broken-{uuid.uuid4().hex[:8]}"
    result = await stream_chat(http, completions(lab), body(relay="detached_unbounded"),
                               headers={"X-Request-Id": rid}, stop_after_tokens=3)
    assert result.closed_early
    record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, rid, 10.0)
    assert record.state == pb.GENERATION_STATE_COMPLETED
    assert record.tokens_generated == ANSWER
