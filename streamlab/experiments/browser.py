"""Debian's chromium, headless, driven over the DevTools protocol.

Why not Playwright: it wants its own browser download (the lab installs none)
and a Node driver; the DevTools protocol over one websocket per page (the
`websockets` package the project already has) is all the lab needs: open
pages, navigate, read a page's state with Runtime.evaluate, close a page.

The browser starts with a fresh profile in a temporary directory and
`--remote-debugging-port=0`; Chrome writes the port it picked to
`DevToolsActivePort` in that profile, which is how we find it without racing
for a free port. Everything has a deadline, and the process group is always
killed at the end. Used by the seventh-tab scenario (streamlab/experiments/scenarios/
seventh_tab.py) and the browser tests (tests/integration/).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import httpx
import websockets

from streamlab.errors import StreamlabError
from streamlab.experiments.report import JSON

# The flags that work headless, as root, in a container; no background traffic
# (its connections would count in the scenarios' connection figures).
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
    "--disable-dev-shm-usage",  # containers often have a tiny /dev/shm
]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def trust_spki_flag(spki_sha256: Sequence[str]) -> str:
    """Trust certificates with these keys and no others: chromium honours it only
    with a --user-data-dir, which chromium() always gives."""
    return f"--ignore-certificate-errors-spki-list={','.join(spki_sha256)}"


class BrowserError(StreamlabError):
    pass


class DevToolsTarget(TypedDict):
    """What /json/new and /json/list say of a tab (the fields this module reads)."""

    id: str
    type: str
    webSocketDebuggerUrl: str


def _object(value: JSON, what: str) -> dict[str, JSON]:
    """A DevTools message that must be an object, or BrowserError saying which."""
    if not isinstance(value, dict):
        raise BrowserError(f"{what}: expected an object, got {type(value).__name__}")
    return value


def _target(value: JSON) -> DevToolsTarget:
    tab = _object(value, "a DevTools target")
    id_, kind, url = tab.get("id"), tab.get("type"), tab.get("webSocketDebuggerUrl")
    if not (isinstance(id_, str) and isinstance(kind, str) and isinstance(url, str)):
        raise BrowserError(f"a DevTools target without id, type or websocket url: {tab}")
    return DevToolsTarget(id=id_, type=kind, webSocketDebuggerUrl=url)


class Page:
    def __init__(self, ws: websockets.ClientConnection, target_id: str = "") -> None:
        self._ws = ws
        self._next_id = 0
        self.target_id = target_id

    async def call(self, method: str, params: Mapping[str, JSON] | None = None,
                   timeout_s: float = 10.0) -> dict[str, JSON]:
        """One DevTools method's result: an object whose fields the method defines."""
        self._next_id += 1
        call_id = self._next_id
        await self._ws.send(json.dumps({"id": call_id, "method": method,
                                        "params": dict(params or {})}))
        async with asyncio.timeout(timeout_s):
            while True:
                message = _object(json.loads(await self._ws.recv()), method)
                if message.get("id") != call_id:
                    continue  # an event we did not subscribe to, or an old reply
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return _object(message.get("result", {}), f"{method}'s result")

    # The expression's value, as JSON; typed Any because its shape is the
    # script's, which the caller wrote and knows (and narrows where it matters).
    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate",
                                 {"expression": expression, "returnByValue": True,
                                  "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails']}")
        return _object(result.get("result"), "Runtime.evaluate's value").get("value")

    async def navigate(self, url: str) -> None:
        result = await self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"navigating to {url}: {result['errorText']}")

    async def wait_loaded(self, timeout_s: float = 10.0) -> None:
        """Until the document navigated to has loaded (Page.navigate returns earlier)."""
        async with asyncio.timeout(timeout_s):
            while True:
                if await self.evaluate("document.readyState") == "complete":
                    return
                await asyncio.sleep(0.02)


class Browser:
    """One chromium: its pages share one network stack, so one connection pool
    per origin (what the seventh-tab scenario is about)."""

    def __init__(self, port: int, http: httpx.AsyncClient, stack: contextlib.AsyncExitStack
                 ) -> None:
        self.port = port
        self._http = http
        self._stack = stack
        self._sockets: dict[str, websockets.ClientConnection] = {}

    async def new_page(self, url: str = "about:blank") -> Page:
        """A new tab (its own renderer, the browser's shared network stack)."""
        response = await self._http.put(f"http://127.0.0.1:{self.port}/json/new?{url}")
        response.raise_for_status()
        return await self._attach(_target(response.json()))

    async def first_page(self) -> Page:
        targets = (await self._http.get(f"http://127.0.0.1:{self.port}/json/list")).json()
        return await self._attach(next(_target(t) for t in targets
                                       if isinstance(t, dict) and t.get("type") == "page"))

    async def close_page(self, page: Page) -> None:
        """Close the tab, as a user does: its connections go with it."""
        ws = self._sockets.pop(page.target_id, None)
        if ws is not None:
            await ws.close()
        response = await self._http.get(
            f"http://127.0.0.1:{self.port}/json/close/{page.target_id}")
        response.raise_for_status()

    async def _attach(self, target: DevToolsTarget) -> Page:
        ws = await self._stack.enter_async_context(
            websockets.connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=10))
        self._sockets[target["id"]] = ws
        return Page(ws, target["id"])


@contextlib.asynccontextmanager
async def chromium(executable: str, extra_flags: Sequence[str] = (),
                   start_timeout_s: float = 20.0) -> AsyncIterator[Browser]:
    """A headless chromium with a new empty profile; killed (its whole process
    group) and its profile removed on the way out."""
    profile = Path(tempfile.mkdtemp(prefix="streamlab-chromium-"))
    log = (profile / "chromium.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        executable, *CHROMIUM_FLAGS, *extra_flags, f"--user-data-dir={profile}",
        "about:blank", stdout=log, stderr=log, start_new_session=True)
    try:
        async with asyncio.timeout(start_timeout_s):
            port_file = profile / "DevToolsActivePort"
            while not port_file.exists() or not port_file.read_text().strip():
                if process.returncode is not None:
                    raise BrowserError(f"chromium exited with {process.returncode}; "
                                       f"see {profile / 'chromium.log'}")
                await asyncio.sleep(0.05)
            port = int(port_file.read_text().split()[0])
        async with contextlib.AsyncExitStack() as stack:
            http = await stack.enter_async_context(httpx.AsyncClient(timeout=5.0))
            yield Browser(port, http, stack)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(5):
                await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        log.close()
        shutil.rmtree(profile, ignore_errors=True)


@contextlib.asynccontextmanager
async def chromium_page(executable: str, start_timeout_s: float = 20.0,
                        extra_flags: Sequence[str] = ()) -> AsyncIterator[Page]:
    """A chromium and its first tab."""
    async with chromium(executable, extra_flags, start_timeout_s) as browser:
        yield await browser.first_page()
