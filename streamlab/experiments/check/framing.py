"""Framing: the stream is what an OpenAI SDK can read.

    stream    every event parses by the WHATWG rules (the project's codec) and
              its data is JSON, `data: [DONE]` ends the stream and nothing
              follows it, `usage` rides on the last chunk when
              `stream_options.include_usage` is asked
    errors    a bad request gets a 4xx whose body is OpenAI's error object
              ({"error": {"message": ..., "type": ...}}), and no malformed
              request gets a 5xx (a 5xx tells clients to retry what will never
              succeed, and pages whoever is on call)
"""

from __future__ import annotations

import json

import httpx

from streamlab.experiments.check.registry import Session, check, streams_budget
from streamlab.experiments.check.verdict import judged
from streamlab.experiments.report import JSON, Check, Report


def malformed(model: str) -> dict[str, bytes]:
    """Malformed requests, a few of the lab's own catalogue of bad input
    (tests/integration/bad_input_cases.py): what is wrong with each → its raw
    body. Every one must get a 4xx, never a 5xx."""
    ok_messages: list[JSON] = [{"role": "user", "content": "hi"}]
    cases: dict[str, JSON] = {
        "messages is not a list": {"model": model, "messages": "hi", "stream": True},
        "no messages": {"model": model, "stream": True},
        "max_tokens is a string": {"model": model, "messages": ok_messages,
                                   "max_tokens": "ten", "stream": True},
        "an unknown role": {"model": model, "messages": [{"role": "robot", "content": "hi"}],
                            "stream": True},
        "a negative max_tokens": {"model": model, "messages": ok_messages, "max_tokens": -1,
                                  "stream": True},
    }
    out = {name: json.dumps(body).encode() for name, body in cases.items()}
    out["a body that is not JSON"] = b'{"model": "' + model.encode() + b'", "messages": ['
    return out


def error_shape(body: bytes) -> bool:
    """OpenAI's error object: {"error": {"message": str, "type": str, ...}}."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return (isinstance(error, dict) and isinstance(error.get("message"), str)
            and isinstance(error.get("type"), str | None))


FRAMING = "events parse (WHATWG), [DONE] ends the stream, usage on the last chunk"
ERRORS = "malformed requests get a 4xx with OpenAI's error object"
MAX_ERROR_BODY = 64 * 1024


@check("framing", FRAMING, headline=("events", "tokens"), budget_s=streams_budget())
async def stream_framing(session: Session) -> Report:
    target = session.target
    body = target.body("Say hello in five words.", max_tokens=16,
                       lab={"prefill_ms": 0, "token_gap_ms": 5, "answer_tokens": 8},
                       stream_options={"include_usage": True})
    record = await session.stream(body)
    usage = (record.last_chunk or {}).get("usage")
    figures = {
        "status": record.status, "events": record.events, "tokens": record.token_chunks,
        "not_json": len(record.bad_json), "done_last": record.done and not record.after_done,
        "usage_on_last": isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int),
        "invalid_utf8": record.invalid_utf8, "transport_error": record.error_text or None,
    }
    return judged("framing", FRAMING, figures, (
        Check("transport_error", "==", None, "the stream did not end cleanly: see what the "
                                             "client met (an answer that never ends, a line "
                                             "that never does, a cut)"),
        Check("invalid_utf8", "==", 0, "SSE is UTF-8 by definition: a browser's EventSource "
                                       "shows U+FFFD for these bytes; encode every chunk as "
                                       "UTF-8"),
        Check("status", "==", 200, "the stream request was refused: check --model and the key"),
        Check("not_json", "==", 0, "an event's data is not JSON: an SDK raises on it; send one "
                                   "JSON chunk per `data:` line and a blank line after each"),
        Check("done_last", "==", True, "the stream must end with `data: [DONE]` and nothing "
                                       "after it; SDKs wait for it (or read on past it)"),
        Check("usage_on_last", "==", True, "stream_options.include_usage asks for a last chunk "
                                           "with `usage` (choices: []); send it before [DONE]"),
    ))


async def answer_to(client: httpx.AsyncClient, url: str, raw: bytes, headers: dict[str, str]
                    ) -> tuple[int, bytes]:
    """A malformed request's status and, for an error, its body (the first
    MAX_ERROR_BODY bytes). A 2xx is not read: a server that takes a negative
    max_tokens may stream to the end of its context (llama.cpp's does), and the
    status alone is the verdict."""
    async with client.stream("POST", url, content=raw, headers=headers) as response:
        if response.is_success:
            return response.status_code, b""
        body = b""
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) >= MAX_ERROR_BODY:
                break
        return response.status_code, body


@check("errors", ERRORS, headline=("bad_requests", "answered_5xx"),
       budget_s=lambda target: 7 * target.timeout_s)
async def error_framing(session: Session) -> Report:
    target, shared = session.target, session.client
    headers = {**target.headers(), "Content-Type": "application/json"}
    statuses: dict[str, int] = {}
    shapes: dict[str, bool] = {}
    # Connections of their own: a server may close a kept-alive connection after
    # a bad request (llm-mock-api does after its 500), and the next check would
    # meet that close on a reused connection as its own failure.
    async with httpx.AsyncClient(timeout=shared.timeout) as client:
        for name, raw in malformed(target.model).items():
            try:
                statuses[name], body = await answer_to(client, target.chat_url, raw, headers)
            except httpx.HTTPError:
                statuses[name] = 0  # dropped without an answer
                shapes[name] = False
                continue
            shapes[name] = error_shape(body)
    not_4xx = [f"{name}: {code or 'dropped'}" for name, code in statuses.items()
               if not 400 <= code < 500]
    figures = {
        "bad_requests": len(statuses),
        "answered_5xx": sum(code >= 500 for code in statuses.values()),
        "not_4xx": len(not_4xx),
        "first_not_4xx": not_4xx[0] if not_4xx else None,
        "every_not_4xx": "; ".join(not_4xx) or None,
        "error_object": all(shapes.values()),
        "first_bad_shape": next((n for n, ok in shapes.items() if not ok), None),
    }
    return judged("errors", ERRORS, figures, (
        Check("answered_5xx", "==", 0, "validate the request before starting the generation "
                                       "and answer 400/422; a 5xx makes clients retry"),
        Check("not_4xx", "==", 0, "a malformed request must get a 4xx"),
        Check("error_object", "==", True, "answer errors as {\"error\": {\"message\", "
                                          "\"type\"}}: SDKs read the message from there"),
    ))
