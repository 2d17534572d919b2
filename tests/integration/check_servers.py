"""Small real OpenAI-compatible servers that misbehave in one way each, for
`streamlab check` to flag (tests/integration/test_check.py). Each is a
Starlette app served by uvicorn on a free port in a thread of the test:

    buffer  produces its tokens one by one but sends the whole answer (headers
            included) only at the end: what a buffering proxy does
    silent  thinks for `silence_s` before the first token of a long prompt (a
            prefill) and sends nothing meanwhile: no heartbeat
    leak    keeps generating when the client leaves, and says so on /metrics
            (vLLM's `vllm:num_requests_running`, which stays up)
    grow    generates into a queue nobody bounds: a reader that stops reading
            does not slow it, the answer piles up in the server's memory
    good    none of these: its generation waits for a reader that stopped
            (a bounded queue between the model and the socket)

Each may also misbehave in one way more, set by a keyword: `pause_s` (a
silence mid-answer, after PAUSE_AFTER tokens, as a reasoning model's hidden
thinking; with `ping_s`, `: ping` comments through it), `role=False` (no role
on the first delta), `finish=False` (no finish_reason), `tools` ("good", or
"bad": no index, the id and name on every delta), `slots` (generations at
once, as an engine's batch; a request waits for a slot), `metrics=False` (no
/metrics), `turns` (streams hold one lock in turns of TURN_TOKENS tokens: a
stall only concurrency shows), or `hostile`: "endless" (a token every 10 ms,
never [DONE]), "hugeline" (a 64 MiB `data:` line with no newline), "badutf8"
(invalid UTF-8 in the content) or "noheaders" (never answers at all).

A server may also offer a resumable surface, `POST /v1/streams` and `GET
/v1/streams/{id}/events` with `Last-Event-ID` (the lab gateway's shape), that
resumes `exact`ly after the id sent, or misbehaves: `replay` starts from the
first event again whatever the id (duplicates), `skip` starts two events past
it (a gap).

Otherwise each streams correctly (framing, usage, 4xx with OpenAI's error
object for bad input), so only the matching check should flag it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from streamlab.experiments.check.verdict import document
from streamlab.experiments.report import Report
from streamlab.lab.processes import free_ports

Mode = Literal["buffer", "silent", "leak", "grow", "good"]
Resume = Literal["exact", "replay", "skip"]
Tools = Literal["good", "bad"]
Hostile = Literal["endless", "hugeline", "badutf8", "noheaders"]
PAUSE_AFTER = 5  # tokens before a mid-answer pause
TURN_TOKENS = 10  # tokens a stream makes while it holds the turns' lock
HUGE_LINE = 64 << 20
MODEL = "test-model"
TOKEN_GAP_S = 0.02
# A longer answer than this is produced at full speed: only the slow-reader
# check asks for one (megabytes, to outgrow the transport's buffers).
FAST_ABOVE_TOKENS = 4000
LEAK_TPS = 4000
QUEUE_MAX = 16  # between the generation and the socket, except in the grow mode
RESUME_TOKENS, RESUME_GAP_S = 30, 0.03
LONG_PROMPT_CHARS = 5000  # a prompt this long "prefills" for silence_s on the silent server


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error",
                                   "param": None, "code": None}}, status_code=status)


def _invalid(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list"
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in (
                "system", "user", "assistant", "tool", "developer"):
            return "a message has no valid role"
    max_tokens = body.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return "max_tokens must be a positive integer"
    return None


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    payload = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0,
               "model": MODEL, "choices": [{"index": 0, "delta": delta,
                                            "finish_reason": finish}]}
    return f"data: {json.dumps(payload)}\n\n".encode()


def _usage(tokens: int) -> bytes:
    payload = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0,
               "model": MODEL, "choices": [],
               "usage": {"prompt_tokens": 1, "completion_tokens": tokens,
                         "total_tokens": tokens + 1}}
    return f"data: {json.dumps(payload)}\n\n".encode()


class MisbehavingServer:
    def __init__(self, mode: Mode, silence_s: float = 3.0, resume: Resume | None = None,
                 max_tokens: int = 20000, *, pause_s: float = 0.0, ping_s: float | None = None,
                 role: bool = True, finish: bool = True, tools: Tools | None = None,
                 slots: int | None = None, metrics: bool = True, turns: bool = False,
                 hostile: Hostile | None = None, fast_tps: int | None = None) -> None:
        self.mode = mode
        self.pause_s, self.ping_s, self.role, self.finish = pause_s, ping_s, role, finish
        self.tools, self.hostile = tools, hostile
        self.fast_tps = fast_tps  # a long answer's pace (None: as fast as it goes)
        self.slots = asyncio.Semaphore(slots) if slots else None
        self.turns = asyncio.Lock() if turns else None
        self.max_tokens = max_tokens  # the longest answer it gives
        self.silence_s = silence_s
        self.resume = resume
        self.running = 0  # generations running now (the leak's gauge)
        self.tasks: set[asyncio.Task[None]] = set()  # the streams' producers, kept alive
        self.logs: dict[str, list[bytes]] = {}  # the resumable streams' events, by id
        self.ended: dict[str, asyncio.Event] = {}
        routes = [
            Route("/v1/models", self.models),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
        ]
        if metrics:
            routes.append(Route("/metrics", self.metrics))
        if resume is not None:
            routes += [Route("/v1/streams", self.create_stream, methods=["POST"]),
                       Route("/v1/streams/{sid}/events", self.stream_events)]
        self.app = Starlette(routes=routes)

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": MODEL, "object": "model", "created": 0, "owned_by": "tests"}]})

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{MODEL}"}} {self.running}\n')

    async def generate(self, count: int, prefill_s: float, out: asyncio.Queue[bytes | None],
                       tools: bool = False) -> None:
        """The model: `count` tokens into `out`; a bounded `out` makes it wait
        for its reader (backpressure), an unbounded one never does. With
        `slots`, it first waits for a free one, and holds it to its end."""
        async with self.slots or contextlib.nullcontext():
            self.running += 1
            try:
                await asyncio.sleep(prefill_s)
                if tools:
                    for delta in self.tool_deltas():
                        await out.put(_chunk(delta))
                        await asyncio.sleep(TOKEN_GAP_S)
                    await out.put(_chunk({}, "tool_calls" if self.finish else None))
                    await out.put(None)
                    return
                await self.tokens(count, out)
                await out.put(_chunk({}, "length" if self.finish else None))
                await out.put(None)
            finally:
                self.running -= 1

    async def tokens(self, count: int, out: asyncio.Queue[bytes | None]) -> None:
        fast = count > FAST_ABOVE_TOKENS
        gap = 0.0 if fast else TOKEN_GAP_S
        # A long answer at fast_tps: a 1 ms sleep every fast_tps / 1000 tokens
        # (the loop's timers do not keep shorter sleeps). The leak paces its
        # long answers at LEAK_TPS at least: one made at full speed would be
        # done (into the socket's buffers) before its client could leave.
        tps = self.fast_tps or (LEAK_TPS if self.mode == "leak" else None)
        every = max(1, tps // 1000) if fast and tps else 0
        for i in range(count):
            if every and i % every == 0:
                await asyncio.sleep(0.001)
            if i == PAUSE_AFTER and self.pause_s:
                await asyncio.sleep(self.pause_s)  # thinking, with nothing to show
            if self.turns is not None and i % TURN_TOKENS == 0:
                async with self.turns:  # the others wait for this stream's turn to end
                    for j in range(i, min(i + TURN_TOKENS, count)):
                        await out.put(self.token(j))
                        await asyncio.sleep(gap)
            elif self.turns is None:
                await out.put(self.token(i))
                await asyncio.sleep(gap)

    def token(self, i: int) -> bytes:
        delta = {"content": f"t{i} "}
        if i == 0 and self.role:
            delta = {"role": "assistant", **delta}
        return _chunk(delta)

    def tool_deltas(self) -> list[dict[str, Any]]:
        """One get_weather call, its arguments in three fragments."""
        fragments = ['{"city": ', '"Par', 'is"}']
        if self.tools == "good":
            first = {"index": 0, "id": "call_0", "type": "function",
                     "function": {"name": "get_weather", "arguments": ""}}
            rest = [{"index": 0, "function": {"arguments": f}} for f in fragments]
            return [{"role": "assistant", "tool_calls": [d]} for d in [first, *rest]]
        # No index, and the id and name on every delta: what the SDKs read as
        # one call named get_weatherget_weatherget_weather.
        return [{"role": "assistant", "tool_calls": [{
            "id": "call_0", "type": "function",
            "function": {"name": "get_weather", "arguments": f}}]} for f in fragments]

    async def chat(self, request: Request) -> Response:
        if self.hostile is not None:
            return await self.hostile_answer()
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error("the body is not JSON")
        problem = _invalid(body)
        if problem is not None:
            return _error(problem)
        count = min(body.get("max_tokens", 16), self.max_tokens)
        long_prompt = sum(len(str(m.get("content", ""))) for m in body["messages"])
        prefill_s = self.silence_s if (self.mode == "silent"
                                       and long_prompt > LONG_PROMPT_CHARS) else 0.0
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(
            0 if self.mode == "grow" else QUEUE_MAX)
        tools = bool(body.get("tools")) and self.tools is not None
        task = asyncio.create_task(self.generate(count, prefill_s, queue, tools))
        # Held until it ends: the loop keeps only a weak reference, and a leaked
        # generation collected mid-run would end (its `finally`) like a stopped one.
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

        async def events() -> AsyncIterator[bytes]:
            try:
                while True:
                    try:
                        item = await asyncio.wait_for(queue.get(), self.ping_s)
                    except TimeoutError:
                        yield b": ping\n\n"  # nothing to send: keep the hops awake
                        continue
                    if item is None:
                        break
                    yield item
                if usage:
                    yield _usage(count)
                yield b"data: [DONE]\n\n"
            finally:
                if self.mode != "leak":
                    task.cancel()  # the client left: stop generating (the leak does not)

        if self.mode == "buffer":
            whole = b"".join([item async for item in events()])
            return Response(whole, media_type="text/event-stream")
        return StreamingResponse(events(), media_type="text/event-stream")


    async def hostile_answer(self) -> Response:
        if self.hostile == "noheaders":
            await asyncio.sleep(3600)  # the request is read; no answer ever comes

        async def endless() -> AsyncIterator[bytes]:
            for i in itertools.count():
                yield _chunk({"content": f"t{i} "})
                await asyncio.sleep(0.01)

        async def huge_line() -> AsyncIterator[bytes]:
            yield b"data: "
            block = b"x" * 65536
            for _ in range(HUGE_LINE // len(block)):
                yield block
            await asyncio.sleep(3600)  # and the line never ends

        async def bad_utf8() -> AsyncIterator[bytes]:
            yield _chunk({"role": "assistant", "content": "ok "})
            for _ in range(5):
                yield b'data: {"id": "x", "object": "chat.completion.chunk", "choices": [' \
                      b'{"index": 0, "delta": {"content": "\xff\xfe\xc3"}, ' \
                      b'"finish_reason": null}]}\n\n'
                await asyncio.sleep(TOKEN_GAP_S)
            yield _chunk({}, "stop")
            yield b"data: [DONE]\n\n"

        body = {"endless": endless, "hugeline": huge_line, "badutf8": bad_utf8}[
            str(self.hostile)]()
        return StreamingResponse(body, media_type="text/event-stream")

    # ---- the resumable surface ------------------------------------------------------

    async def produce(self, sid: str) -> None:
        log, ended = self.logs[sid], self.ended[sid]
        for i in range(RESUME_TOKENS):
            log.append(f"id: {sid}:{i + 1}\nevent: token\n"
                       f"data: {json.dumps({'index': i, 'text': f't{i} '})}\n\n".encode())
            await asyncio.sleep(RESUME_GAP_S)
        log.append(f"id: {sid}:{RESUME_TOKENS + 1}\nevent: done\n"
                   'data: {"finish_reason": "stop"}\n\n'.encode())
        ended.set()

    async def create_stream(self, request: Request) -> Response:
        sid = f"s{len(self.logs) + 1}"
        self.logs[sid], self.ended[sid] = [], asyncio.Event()
        self.tasks.add(asyncio.create_task(self.produce(sid)))
        return JSONResponse({"id": sid, "events_url": f"/v1/streams/{sid}/events"},
                            status_code=201)

    async def stream_events(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        if sid not in self.logs:
            return _error("no such stream", 404)
        last = request.headers.get("last-event-id", "")
        start = int(last.rpartition(":")[2]) if last else 0  # events after this sequence
        if last and self.resume == "replay":
            start = 0  # the id is ignored: every event again
        elif last and self.resume == "skip":
            start += 2  # two events nobody will ever see
        log, ended = self.logs[sid], self.ended[sid]

        async def events() -> AsyncIterator[bytes]:
            sent = start
            while True:
                while sent < len(log):
                    yield log[sent]
                    sent += 1
                if ended.is_set() and sent >= len(log):
                    return
                await asyncio.sleep(RESUME_GAP_S / 3)

        return StreamingResponse(events(), media_type="text/event-stream")


def keep(report: Report, server: str) -> None:
    """With STREAMLAB_CHECK_RESULTS=DIR, the report as DIR/check-<server>.json,
    the document `streamlab check --json` prints: how the committed runs in
    docs/results/ were made."""
    where = os.environ.get("STREAMLAB_CHECK_RESULTS")
    if where:
        doc = document(report, url=report.variant, model=str(report.figures.get("model", "")))
        (Path(where) / f"check-{server}.json").write_text(
            json.dumps(doc, indent=2, default=str) + "\n")


@contextlib.contextmanager
def serve(server: MisbehavingServer) -> Iterator[str]:
    """The server on a free port in a thread; yields its OpenAI base URL."""
    port = free_ports(1)[0]
    config = uvicorn.Config(server.app, host="127.0.0.1", port=port, log_level="warning",
                            lifespan="off", ws="none")
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15.0
    while not running.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the {server.mode} test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        running.should_exit = True
        running.force_exit = True  # the leak's generations would hold the shutdown
        thread.join(timeout=10.0)
