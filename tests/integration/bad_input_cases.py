"""The malformed-input catalogue that tests/integration/test_bad_input.py sends
through the edge: every case, what it must get, and raw clients (HTTP/1.1 and
WebSocket over plain sockets) that can send what httpx and websockets refuse
to (a NUL in a path, an invalid UTF-8 text frame, a reserved opcode).

Each case names what it must get:

    4xx     an HTTP 4xx whose body is OpenAI's error JSON
    served  a 2xx (input at a limit, not past it), or a WebSocket that streams
            to [DONE] and closes 1000
    close   a WebSocket close with the given code; a JSON reason when the
            gateway closes (1003, 1007, 1008, 1009), just the code when the
            WebSocket layer does (1002 for a broken frame, 1007 for bad UTF-8)

Whatever it must get, a case never gets a 5xx and is never dropped without an
answer (the connection closed or reset with no status or close frame).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

TIMEOUT_S = 20.0
SERVED_TIMING = {"prefill_ms": 0, "token_gap_ms": 0, "answer_tokens": 2}
POST_ROUTES = ("/v1/chat/completions", "/v1/jobs", "/v1/streams")


@dataclass(frozen=True)
class Outcome:
    kind: str  # "http", "ws" (a close frame), "dropped"
    code: int  # the HTTP status or the close code (0 when dropped)
    detail: str  # the error's code, the close reason, or why it was dropped
    json_error: bool  # the body (or close reason) is OpenAI-style / JSON
    streamed: bool = False  # ws: tokens then [DONE] before the close

    @property
    def label(self) -> str:
        if self.kind == "dropped":
            return "DROPPED"
        if self.kind == "ws":
            return f"close {self.code}" + (" +tokens" if self.streamed else "")
        if self.code < 400:
            return f"{self.code}"
        return f"{self.code}" + (" json" if self.json_error else " NOT-JSON")


@dataclass(frozen=True)
class Case:
    category: str
    name: str
    expect: str  # "4xx", "served", "close"
    send: Callable[[Target], Outcome]
    close_code: int = 0  # for "close"
    json_reason: bool = True  # for "close": the gateway's own (JSON) or the WebSocket layer's

    def problem(self, got: Outcome) -> str | None:
        """What is wrong with `got` for this case, or None."""
        if got.kind == "dropped":
            return f"dropped without an answer: {got.detail}"
        if got.kind == "http" and got.code >= 500:
            return f"a {got.code}"
        if self.expect == "4xx":
            if got.kind != "http" or not 400 <= got.code < 500 or not got.json_error:
                return f"wanted a JSON 4xx, got {got.label} {got.detail[:80]}"
        elif self.expect == "served":
            ok = (got.kind == "http" and 200 <= got.code < 300) or (
                got.kind == "ws" and got.code == 1000 and got.streamed)
            if not ok:
                return f"wanted it served, got {got.label} {got.detail[:80]}"
        elif self.expect == "close":
            if got.kind != "ws" or got.code != self.close_code:
                return f"wanted close {self.close_code}, got {got.label} {got.detail[:80]}"
            if self.json_reason and not got.json_error:
                return f"close {got.code} without a JSON reason: {got.detail[:80]!r}"
        return None


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    stream_id: str  # a resumable stream this client created, for Last-Event-ID cases

    @classmethod
    def of(cls, edge_url: str, stream_id: str) -> Target:
        parts = urlsplit(edge_url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 80, stream_id)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


# ---- HTTP ----------------------------------------------------------------------------
def is_openai_error(body: bytes) -> tuple[bool, str]:
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False, body[:80].decode("latin-1")
    shaped = isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error)
    return shaped, str(error.get("code")) if isinstance(error, dict) else ""


def via_httpx(method: str, path: str, *, body: bytes | None = None,
              headers: list[tuple[bytes, bytes]] | None = None) -> Callable[[Target], Outcome]:
    def send(target: Target) -> Outcome:
        all_headers = [(b"content-type", b"application/json"), *(headers or [])]
        try:
            with httpx.Client(timeout=TIMEOUT_S) as client:
                response = client.request(method, target.url + path, content=body,
                                          headers=all_headers)
        except httpx.HTTPError as exc:
            return Outcome("dropped", 0, f"{type(exc).__name__}: {exc}", False)
        shaped, code = is_openai_error(response.content)
        return Outcome("http", response.status_code, code, shaped)
    return send


def post(path: str, body: bytes | dict[str, Any], **kwargs: Any) -> Callable[[Target], Outcome]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return via_httpx("POST", path, body=raw, **kwargs)


def raw_http(request: bytes | Callable[[Target], bytes]) -> Callable[[Target], Outcome]:
    """Send `request` as it is and read one response (or learn that none came)."""
    def send(target: Target) -> Outcome:
        data = request(target) if callable(request) else request
        try:
            with socket.create_connection((target.host, target.port), timeout=TIMEOUT_S) as sock:
                # The server may answer and close before it has read it all.
                with contextlib.suppress(OSError):
                    sock.sendall(data)
                return read_http_response(sock)
        except OSError as exc:
            return Outcome("dropped", 0, f"{type(exc).__name__}: {exc}", False)
    return send


def read_http_response(sock: socket.socket) -> Outcome:
    wire = b""
    while b"\r\n\r\n" not in wire:
        try:
            chunk = sock.recv(65536)
        except OSError as exc:
            if not wire:
                return Outcome("dropped", 0, f"{type(exc).__name__}: {exc}", False)
            break
        if not chunk:
            if not wire:
                return Outcome("dropped", 0, "closed with no response", False)
            break
        wire += chunk
    head, _, body = wire.partition(b"\r\n\r\n")
    status_line, *header_lines = head.split(b"\r\n")
    parts = status_line.split(b" ")
    if len(parts) < 2 or not parts[1].isdigit():
        return Outcome("dropped", 0, f"not an HTTP response: {wire[:60]!r}", False)
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (line.partition(b":") for line in header_lines)}
    length = int(headers.get(b"content-length", b"-1") or -1)
    chunked = headers.get(b"transfer-encoding", b"").lower() == b"chunked"
    while (length >= 0 and len(body) < length) or (chunked and not body.endswith(b"0\r\n\r\n")):
        try:
            chunk = sock.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        body += chunk
    if chunked:
        body = dechunk(body)
    shaped, code = is_openai_error(body)
    return Outcome("http", int(parts[1]), code, shaped)


def dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2:]
    return out


def http_request(method: bytes, path: bytes, headers: bytes = b"", body: bytes = b"",
                 version: bytes = b"HTTP/1.1") -> Callable[[Target], bytes]:
    def build(target: Target) -> bytes:
        return (method + b" " + path + b" " + version + b"\r\nHost: " + target.host.encode()
                + b"\r\nConnection: close\r\n" + headers + b"\r\n" + body)
    return build


# ---- WebSocket ---------------------------------------------------------------------
def ws_frame(opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0,
             masked: bool = True) -> bytes:
    head = bytes([(0x80 if fin else 0) | (rsv << 4) | opcode])
    mask_bit = 0x80 if masked else 0
    n = len(payload)
    if n < 126:
        head += bytes([mask_bit | n])
    elif n < 1 << 16:
        head += bytes([mask_bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([mask_bit | 127]) + struct.pack("!Q", n)
    if not masked:
        return head + payload
    key = os.urandom(4)
    # XOR as one big integer: a megabyte masks in milliseconds.
    mask = (key * (n // 4 + 1))[:n]
    body = (int.from_bytes(payload, "big") ^ int.from_bytes(mask, "big")).to_bytes(n, "big")
    return head + key + body


def text(payload: str | bytes) -> bytes:
    return ws_frame(0x1, payload.encode() if isinstance(payload, str) else payload)


def ws(*frames: bytes | Callable[[], bytes]) -> Callable[[Target], Outcome]:
    """Open /ws through the edge, send `frames`, read until the server's close."""
    def send(target: Target) -> Outcome:
        try:
            with socket.create_connection((target.host, target.port), timeout=TIMEOUT_S) as sock:
                key = base64.b64encode(os.urandom(16))
                sock.sendall(b"GET /ws HTTP/1.1\r\nHost: " + target.host.encode()
                             + b"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                             b"Sec-WebSocket-Key: " + key
                             + b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
                reader = FrameReader(sock)
                status = reader.handshake()
                if status != 101:
                    return Outcome("http", status, "handshake refused", False)
                for frame in frames:
                    try:
                        sock.sendall(frame() if callable(frame) else frame)
                    except OSError:
                        break  # the server closed first: read what it said
                return reader.until_close()
        except OSError as exc:
            return Outcome("dropped", 0, f"{type(exc).__name__}: {exc}", False)
    return send


class FrameReader:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed without a close frame")
            self._buffer += chunk
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def handshake(self) -> int:
        while b"\r\n\r\n" not in self._buffer:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            self._buffer += chunk
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        return int(head.split(b" ")[1])

    def until_close(self) -> Outcome:
        messages: list[bytes] = []
        try:
            while True:
                first, second = self._read(2)
                opcode, n = first & 0x0F, second & 0x7F
                if n == 126:
                    n = struct.unpack("!H", self._read(2))[0]
                elif n == 127:
                    n = struct.unpack("!Q", self._read(8))[0]
                payload = self._read(n)
                if opcode == 0x8:
                    code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                    reason = payload[2:].decode("utf-8", "replace")
                    try:
                        json.loads(reason)
                        json_reason = True
                    except ValueError:
                        json_reason = False
                    streamed = bool(messages) and messages[-1] == b"[DONE]"
                    return Outcome("ws", code, reason, json_reason, streamed)
                if opcode in (0x1, 0x2):
                    messages.append(payload)
        except (OSError, ConnectionError) as exc:
            return Outcome("dropped", 0, f"{type(exc).__name__}: {exc}", False)


# ---- the catalogue ----------------------------------------------------------------------
def chat(content: Any = "hi", **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "stream": False,
            "streamlab": dict(SERVED_TIMING), **fields}


def raw_chat(**fields: str) -> bytes:
    """A chat body with some fields as raw JSON text (for escapes JSON libraries
    will not write, like a lone surrogate)."""
    parts = {"messages": '[{"role": "user", "content": "hi"}]', "stream": "false",
             "streamlab": json.dumps(SERVED_TIMING), **fields}
    return ("{" + ", ".join(f'"{k}": {v}' for k, v in parts.items()) + "}").encode()


def ws_prompt(**fields: Any) -> str:
    return json.dumps({"prompt": "hi", "streamlab": dict(SERVED_TIMING), **fields})


SURROGATES = ["\\ud800", "\\udfff", "\\udc00\\ud800", "x\\udbffy"]
NON_ASCII_IDS = ["café".encode(), "café".encode("latin-1"), "😀".encode(), "ü".encode(),
                 b"a\xc2\xa0b", b"\xe2\x80\x8b", b"\xff\xfe"]


def resume_from(last_event_id: bytes) -> Callable[[Target], Outcome]:
    def send(target: Target) -> Outcome:
        return via_httpx("GET", f"/v1/streams/{target.stream_id}/events",
                         headers=[(b"last-event-id", last_event_id)])(target)
    return send


def catalogue() -> list[Case]:
    cases: list[Case] = []

    def add(category: str, name: str, expect: str, send: Callable[[Target], Outcome],
            **kwargs: Any) -> None:
        cases.append(Case(category, name, expect, send, **kwargs))

    # Lone surrogates: JSON decodes them, UTF-8 cannot carry them (was a 500).
    for route in POST_ROUTES:
        for s in SURROGATES:
            for field, raw in [
                ("content", raw_chat(messages=f'[{{"role": "user", "content": "{s}"}}]')),
                ("stop", raw_chat(stop=f'"{s}"')),
                ("stop-list", raw_chat(stop=f'["ok", "{s}"]')),
                ("model", raw_chat(model=f'"{s}"')),
                ("part", raw_chat(messages='[{"role": "user", "content": '
                                  f'[{{"type": "text", "text": "{s}"}}]}}]')),
            ]:
                add("surrogate", f"{route} {field} {s}", "4xx", post(route, raw))
        add("surrogate", f"{route} request_id", "4xx",
            post(route, raw_chat(streamlab='{"request_id": "a\\ud800"}')))

    # Non-ASCII headers and ids: gRPC metadata is ASCII (was 502 "Invalid metadata").
    for route in ("/v1/chat/completions", "/v1/jobs"):
        for value in NON_ASCII_IDS:
            add("non-ascii id", f"{route} X-Request-Id {value!r}", "4xx",
                post(route, chat(), headers=[(b"x-request-id", value)]))
    for route in POST_ROUTES:
        for rid in ["café", "id-😀", "naïve"]:
            add("non-ascii id", f"{route} streamlab.request_id {rid}", "4xx",
                post(route, chat(streamlab={**SERVED_TIMING, "request_id": rid})))
        # Headers the gateway reads for nothing but identity: still served.
        for header in (b"x-client-id", b"authorization", b"x-forwarded-for"):
            add("non-ascii header", f"{route} {header.decode()}", "served",
                post(route, chat(), headers=[(header, "café".encode())]))
    for value in NON_ASCII_IDS[:4]:
        add("non-ascii header", f"Last-Event-ID {value!r}", "4xx", resume_from(value))

    # Types as strict as OpenAI's; n > 1 and unknown models refused (were 200).
    wrong_types: list[tuple[str, dict[str, Any]]] = [
        ("max_tokens str", {"max_tokens": "10"}), ("max_tokens true", {"max_tokens": True}),
        ("max_tokens float", {"max_tokens": 10.5}), ("max_tokens list", {"max_tokens": [1]}),
        ("stream yes", {"stream": "yes"}), ("stream 1", {"stream": 1}),
        ("stream str true", {"stream": "true"}), ("n 2", {"n": 2}), ("n 0", {"n": 0}),
        ("n str", {"n": "1"}), ("model unknown", {"model": "gpt-9"}),
        ("model int", {"model": 5}), ("temperature str", {"temperature": "0.5"}),
        ("temperature 3", {"temperature": 3}), ("temperature bool", {"temperature": True}),
        ("top_p 2", {"top_p": 2}), ("seed float", {"seed": 1.5}), ("seed str", {"seed": "7"}),
        ("presence_penalty 3", {"presence_penalty": 3}), ("stop int", {"stop": 5}),
        ("stop list of int", {"stop": [1]}), ("stop 5 items", {"stop": ["a"] * 5}),
        ("stop empty", {"stop": ""}), ("role robot", {"messages": [{"role": "robot",
                                                                       "content": "x"}]}),
        ("content int", {"messages": [{"role": "user", "content": 5}]}),
        ("content null", {"messages": [{"role": "user", "content": None}]}),
        ("image part", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://example.invalid/a.png"}}]}]}),
        ("audio part", {"messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]}),
        ("text part without text", {"messages": [{"role": "user", "content": [
            {"type": "text"}]}]}),
        ("messages empty", {"messages": []}), ("messages object", {"messages": {}}),
        ("streamlab prefill str", {"streamlab": {"prefill_ms": "1"}}),
        ("streamlab unknown", {"streamlab": {"nope": 1}}),
    ]
    for route in POST_ROUTES:
        for name, fields in wrong_types:
            add("types", f"{route} {name}", "4xx", post(route, chat(**fields)))

    # JSON that is not a request.
    for route in POST_ROUTES:
        for name, raw in [("not json", b"hello"), ("truncated", b'{"messages": ['),
                          ("trailing garbage", raw_chat() + b"x"), ("empty", b""),
                          ("array", b"[1, 2]"), ("deep nesting", b"[" * 100_000),
                          ("invalid utf-8", b'{"messages": [{"role": "user", "content": "\xff"}]}'),
                          ("NaN temperature", raw_chat(temperature="NaN")),
                          ("huge number", raw_chat(max_tokens="1e400"))]:
            add("json", f"{route} {name}", "4xx", post(route, raw))

    # Sizes at and past each limit (the test lab's: 100,000 prompt characters,
    # 1,000,000 body bytes, max_tokens 100,000 at the engine, 16 MB at nginx).
    for route in POST_ROUTES:
        add("sizes", f"{route} prompt at 100,000 chars", "served",
            post(route, chat("x" * 100_000)))
        add("sizes", f"{route} prompt at 100,001 chars", "4xx", post(route, chat("x" * 100_001)))
        at_limit = json.dumps(chat("x")).encode()
        add("sizes", f"{route} body at 1,000,000 bytes", "served",
            post(route, at_limit[:-1] + b" " * (1_000_000 - len(at_limit)) + b"}"))
        add("sizes", f"{route} body at 1,000,001 bytes", "4xx",
            post(route, at_limit[:-1] + b" " * (1_000_001 - len(at_limit)) + b"}"))
        add("sizes", f"{route} max_tokens 100,000", "served", post(route, chat(max_tokens=100_000)))
        add("sizes", f"{route} max_tokens 100,001", "4xx", post(route, chat(max_tokens=100_001)))
        add("sizes", f"{route} max_tokens 2**32", "4xx", post(route, chat(max_tokens=2**32)))
        add("sizes", f"{route} stop 4 of 256", "served", post(route, chat(stop=["s" * 256] * 4)))
        add("sizes", f"{route} stop of 257", "4xx", post(route, chat(stop=["s" * 257])))
        add("sizes", f"{route} 1,000 pauses", "served", post(route, chat(streamlab={
            **SERVED_TIMING, "pauses": [{"after_token": 99, "pause_ms": 0}] * 1000})))
        add("sizes", f"{route} 1,001 pauses", "4xx", post(route, chat(streamlab={
            **SERVED_TIMING, "pauses": [{"after_token": 99, "pause_ms": 0}] * 1001})))
    big = json.dumps(chat("x")).encode()
    add("sizes", "body at 16 MiB (the gateway's 413)", "4xx",
        post(POST_ROUTES[0], big[:-1] + b" " * (16 * 1024 * 1024 - len(big)) + b"}"))
    add("sizes", "body past 16 MiB (nginx's 413)", "4xx",
        post(POST_ROUTES[0], big[:-1] + b" " * (16 * 1024 * 1024 + 1 - len(big)) + b"}"))
    add("sizes", "a 7,000-byte header", "served",
        post(POST_ROUTES[0], chat(), headers=[(b"x-padding", b"a" * 7_000)]))
    add("sizes", "a 9,000-byte header", "4xx",
        post(POST_ROUTES[0], chat(), headers=[(b"x-padding", b"a" * 9_000)]))
    add("sizes", "headers over 32 KB in all", "4xx",
        post(POST_ROUTES[0], chat(), headers=[(f"x-pad-{i}".encode(), b"a" * 7_000)
                                              for i in range(6)]))
    add("sizes", "a 7,000-byte path", "4xx", via_httpx("GET", "/v1/" + "a" * 7_000))
    add("sizes", "a 9,000-byte path", "4xx", via_httpx("GET", "/v1/" + "a" * 9_000))

    # nginx's own refusals (were HTML or text/plain).
    nginx_cases: list[tuple[str, Callable[[Target], bytes] | bytes]] = [
        ("NUL in the path", http_request(b"GET", b"/v1/mo\x00dels")),
        ("/.. above the root", http_request(b"GET", b"/../../etc/passwd")),
        ("/v1/../.. above the root", http_request(b"GET", b"/v1/../../x")),
        ("space in the path", http_request(b"GET", b"/v1/a b")),
        ("method FOO", http_request(b"FOO", b"/v1/models")),
        ("method PROPFIND", http_request(b"PROPFIND", b"/v1/models")),
        ("method TRACE", http_request(b"TRACE", b"/v1/models")),
        ("HTTP/9.9", http_request(b"GET", b"/v1/models", version=b"HTTP/9.9")),
        ("no Host", b"GET /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n"),
        ("TLS on a plain port", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 40),
        ("Content-Length and chunked", http_request(
            b"POST", b"/v1/chat/completions",
            b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n")),
        ("bad chunk size", http_request(b"POST", b"/v1/chat/completions",
                                        b"Transfer-Encoding: chunked\r\n",
                                        b"ZZ\r\nab\r\n0\r\n\r\n")),
        # A Transfer-Encoding nginx does not know: was its 501 HTML page,
        # naming its version.
        *((f"Transfer-Encoding: {coding}", http_request(
            b"POST", b"/v1/chat/completions",
            f"Transfer-Encoding: {coding}\r\n".encode(), b"0\r\n\r\n"))
          for coding in ("gzip, chunked", "identity", "xchunked", "chunked, chunked")),
        ("space in a header name", http_request(b"GET", b"/v1/models", b"X Bad: 1\r\n")),
        ("NUL in a header value", http_request(b"GET", b"/v1/models", b"X-A: a\x00b\r\n")),
        ("negative Content-Length", http_request(b"POST", b"/v1/chat/completions",
                                                 b"Content-Length: -1\r\n")),
    ]
    for name, request in nginx_cases:
        add("nginx", name, "4xx", raw_http(request))
    # nginx drops a header line without a colon, or with a name it does not
    # accept (ignore_invalid_headers), and serves the rest.
    add("nginx", "header without a colon", "served",
        raw_http(http_request(b"GET", b"/v1/models", b"NoColon\r\n")))
    add("non-ascii header", "a non-ASCII header name", "served",
        raw_http(http_request(b"GET", b"/v1/models", "X-Café: 1\r\n".encode())))
    for method in ("PUT", "PATCH", "DELETE", "GET"):
        add("nginx", f"{method} /v1/chat/completions (the gateway's 405)", "4xx",
            via_httpx(method, "/v1/chat/completions"))
    add("nginx", "unknown path (the gateway's 404)", "4xx", via_httpx("GET", "/v1/nope"))

    # WebSocket: every kind of frame as the first message.
    served = ws_prompt()
    add("websocket", "text: a JSON prompt", "served", ws(text(served)))
    add("websocket", "text: a plain prompt", "served", ws(text("hello")))
    add("websocket", "text: '[' x 100,000 (a plain prompt at the limit)", "served",
        ws(text("[" * 100_000)))
    add("websocket", "text: fragmented", "served",
        ws(ws_frame(0x1, served[:5].encode(), fin=False), ws_frame(0x0, served[5:].encode())))
    add("websocket", "ping, then the prompt", "served", ws(ws_frame(0x9, b"hi"), text(served)))
    add("websocket", "an unsolicited pong, then the prompt", "served",
        ws(ws_frame(0xA, b""), text(served)))
    for name, payload, code in [
        ("empty text", "", 1007), ("'{' x 100,000", "{" * 100_000, 1007),
        ("truncated JSON", '{"prompt": "x"', 1007),
        ("max_tokens 10**12", ws_prompt(max_tokens=10**12), 1007),
        ("max_tokens past the engine's limit", ws_prompt(max_tokens=100_001), 1007),
        ("max_tokens a string", ws_prompt(max_tokens="10"), 1007),
        ("prompt not a string", json.dumps({"prompt": 5}), 1007),
        ("surrogate", '{"prompt": "\\ud800"}', 1007),
        ("non-ASCII request_id", ws_prompt(streamlab={"request_id": "café"}), 1007),
        ("prompt at 100,001 chars", "x" * 100_001, 1009),
        ("text over 1,000,000 bytes", "x" * 1_000_001, 1009),
        ("unknown streamlab field", ws_prompt(streamlab={"x": 1}), 1007),
    ]:
        add("websocket", f"text: {name}", "close", ws(text(payload)), close_code=code)
    for name, binary in [("binary", b"\x00\x01"), ("empty binary", b""),
                         ("JSON as binary", served.encode())]:
        add("websocket", name, "close", ws(ws_frame(0x2, binary)), close_code=1003)
    # Broken frames: the WebSocket layer closes with its own code (no JSON reason).
    for name, frame, code in [
        ("invalid UTF-8 text", ws_frame(0x1, b"\xff\xfe"), 1007),
        ("reserved opcode 0x3", ws_frame(0x3, b"x"), 1002),
        ("RSV bits set", ws_frame(0x1, b"hi", rsv=0b100), 1002),
        ("unmasked client frame", ws_frame(0x1, b"hi", masked=False), 1002),
        ("continuation with nothing to continue", ws_frame(0x0, b"x"), 1002),
        ("fragmented ping", ws_frame(0x9, b"x", fin=False), 1002),
        ("ping over 125 bytes", ws_frame(0x9, b"x" * 126), 1002),
    ]:
        add("websocket", name, "close", ws(frame), close_code=code, json_reason=False)
    # A frame over the WebSocket layer's 16 MiB: it closes 1009 at the frame's
    # header. Only the header is sent: a client still pushing 16 MiB would see
    # its connection reset (TCP resets a socket closed with unread data) before
    # it could read the close frame, on any server.
    over = 16 * 1024 * 1024 + 1
    add("websocket", "a frame announcing 16 MiB + 1", "close",
        ws(bytes([0x81, 0x80 | 127]) + struct.pack("!Q", over) + os.urandom(4)),
        close_code=1009, json_reason=False)
    add("websocket", "a close frame first", "close",
        ws(ws_frame(0x8, struct.pack("!H", 1000))), close_code=1000, json_reason=False)
    return cases
