"""The test helper that cuts a runtime's socket as a killed process's would
(severable.py): no connection outlives ``sever``, not even one accepted as
it was severing, and a target that is not there closes the client's
connection instead of failing the relay's task."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from . import severable
from .severable import Severable


@contextlib.asynccontextmanager
async def echo(path: Path) -> AsyncIterator[None]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(serve, path=str(path))
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


async def ended(reader: asyncio.StreamReader) -> bool:
    """The connection was closed by the other side (EOF or a reset), not kept."""
    try:
        return await asyncio.wait_for(reader.read(1), 5) == b""
    except ConnectionResetError:
        return True


async def test_a_connection_dialling_on_as_it_is_severed_ends_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: registered only once its own connection to the runtime was
    made, a connection accepted just before ``sever`` was relayed on."""
    dialling, go_on = asyncio.Event(), asyncio.Event()
    real = asyncio.open_unix_connection

    async def held(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        dialling.set()
        await go_on.wait()
        return await real(path)

    monkeypatch.setattr(severable.asyncio, "open_unix_connection", held)
    async with echo(tmp_path / "runtime.sock"), Severable(tmp_path / "cut.sock", tmp_path / "runtime.sock") as cut:
        reader, writer = await real(str(cut.socket))
        await asyncio.wait_for(dialling.wait(), 5)
        await cut.sever()
        go_on.set()
        writer.write(b"x")
        assert await ended(reader)
        writer.close()


async def test_a_runtime_not_there_closes_the_clients_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the relay's task failed (FileNotFoundError, logged by asyncio
    as unhandled) and the client's connection was left open."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    async with Severable(tmp_path / "cut.sock", tmp_path / "nothing.sock") as cut:
        reader, writer = await asyncio.open_unix_connection(str(cut.socket))
        assert await ended(reader)
        writer.close()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
