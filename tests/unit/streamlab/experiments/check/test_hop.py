"""The check's hop where no Toxiproxy is installed (an installed wheel before
`streamlab install toxiproxy`): its own asyncio relay, named in the report's
`hop` figure and in the progress, that carries the bytes both ways."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from streamlab import paths
from streamlab.experiments.check.runner import through_hop
from streamlab.experiments.check.target import CheckTarget

pytestmark = pytest.mark.anyio


async def test_without_toxiproxy_the_hop_is_the_checks_own_relay(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(paths.TOXIPROXY_DIR_VAR, str(tmp_path))  # an empty directory, only

    async def upper(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write((await reader.readline()).upper())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(upper, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    said: list[str] = []
    async with server, through_hop(CheckTarget(f"http://127.0.0.1:{port}/v1", "m"),
                                   progress=said.append) as (hopped, hop):
        assert hop == "asyncio relay (no toxiproxy-server found)"
        assert hopped.port != port
        reader, writer = await asyncio.open_connection("127.0.0.1", hopped.port)
        writer.write(b"through the relay\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5.0) == b"THROUGH THE RELAY\n"
        writer.close()
    assert "`streamlab install toxiproxy`" in said[0]
    assert "its own asyncio relay" in said[0]
