"""Debian's chromium, headless, driven over the DevTools protocol.

Why not Playwright: it wants its own browser download (the lab installs none)
and a Node driver; the DevTools protocol over one websocket (the `websockets`
package the project already has) is all these tests need: navigate, and read
the page's state with Runtime.evaluate while Toxiproxy cuts the connection.

The browser starts with a fresh profile in a temporary directory and
`--remote-debugging-port=0`; Chrome writes the port it picked to
`DevToolsActivePort` in that profile, which is how we find it without racing
for a free port. Everything has a deadline, and the process group is always
killed at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import websockets

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


class BrowserError(Exception):
    pass


class Page:
    def __init__(self, ws: websockets.ClientConnection) -> None:
        self._ws = ws
        self._next_id = 0

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   timeout_s: float = 10.0) -> dict[str, Any]:
        self._next_id += 1
        call_id = self._next_id
        await self._ws.send(json.dumps({"id": call_id, "method": method, "params": params or {}}))
        async with asyncio.timeout(timeout_s):
            while True:
                message = json.loads(await self._ws.recv())
                if message.get("id") != call_id:
                    continue  # an event we did not subscribe to, or an old reply
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate",
                                 {"expression": expression, "returnByValue": True,
                                  "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def navigate(self, url: str) -> None:
        result = await self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"navigating to {url}: {result['errorText']}")


@contextlib.asynccontextmanager
async def chromium_page(executable: str, start_timeout_s: float = 20.0) -> AsyncIterator[Page]:
    profile = Path(tempfile.mkdtemp(prefix="streamlab-chromium-"))
    log = (profile / "chromium.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        executable, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank",
        stdout=log, stderr=log, start_new_session=True)
    try:
        async with asyncio.timeout(start_timeout_s):
            port_file = profile / "DevToolsActivePort"
            while not port_file.exists() or not port_file.read_text().strip():
                if process.returncode is not None:
                    raise BrowserError(f"chromium exited with {process.returncode}; "
                                       f"see {profile / 'chromium.log'}")
                await asyncio.sleep(0.05)
            port = int(port_file.read_text().split()[0])
            async with httpx.AsyncClient(timeout=5.0) as http:
                targets = (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
            page_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        async with websockets.connect(page_url, max_size=None, open_timeout=10) as ws:
            yield Page(ws)
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
