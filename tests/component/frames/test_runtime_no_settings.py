"""A runtime that accepts a frames connection and never sends its SETTINGS:
past silent.SETTINGS_WAIT_S the client gets an empty SETTINGS and a GOAWAY
that says no stream was processed (a gRPC client retries its calls on a new
connection), the connection ends, and the proxy's gate is told (frames/silent.py).

Before: the client waited for its calls' deadlines with nothing said, and
hooked calls kept being let through to such a runtime."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from runtimeproxy.frames import silent
from runtimeproxy.frames.connection import Limits
from runtimeproxy.frames.listener import FramesListener

from .. import rawh2
from .test_listener_stop import _Routes, _SilentRuntime, runtimes  # noqa: F401 - the fixture

PODS = "/runtime.v1.RuntimeService/ListPodSandbox"


async def test_a_runtime_that_sends_no_settings_is_taken_as_unreachable_and_the_client_told_to_go(
    sock_dir: Path, runtimes: tuple[Path, asyncio.Queue[_SilentRuntime]], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    monkeypatch.setattr(silent, "SETTINGS_WAIT_S", 0.3)
    path, accepted = runtimes
    told: list[str] = []
    listener = FramesListener(sock_dir / "proxy.sock", path, sock_dir / "unused.sock", _Routes(), [],
                              Limits(max_message=1 << 20), runtime_silent=told.append)
    await listener.start()
    try:
        peer = await rawh2.RawPeer.connect(sock_dir / "proxy.sock")
        peer.writer.write(rawh2.frame(rawh2.SETTINGS, 0, 0, b"") + rawh2.open_call(1, PODS))
        await accepted.get()
        frames = await peer.until(rawh2.GOAWAY)
        assert frames[0][0] == rawh2.SETTINGS and frames[0][3] == b""  # an empty server preface
        last, code = struct.unpack(">II", frames[-1][3][:8])
        assert (last, code) == (0, 0)  # no stream processed: the client may retry them all
        assert b"sent no SETTINGS within 0.3 s" in frames[-1][3][8:]
        assert await peer.read() is None  # and the connection is closed
        assert told == ["it accepted a connection but sent no HTTP/2 SETTINGS within 0.3 s"]
        await peer.close()
    finally:
        listener.stop_accepting()
        await listener.drain(0)


async def test_a_runtime_that_sends_its_settings_late_but_in_time_is_relayed(
    sock_dir: Path, runtimes: tuple[Path, asyncio.Queue[_SilentRuntime]], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """A guard: the bound is on the runtime's silence, not on the connection."""
    monkeypatch.setattr(silent, "SETTINGS_WAIT_S", 0.3)
    path, accepted = runtimes
    told: list[str] = []
    listener = FramesListener(sock_dir / "proxy.sock", path, sock_dir / "unused.sock", _Routes(), [],
                              Limits(max_message=1 << 20), runtime_silent=told.append)
    await listener.start()
    try:
        peer = await rawh2.RawPeer.connect(sock_dir / "proxy.sock")
        peer.writer.write(rawh2.frame(rawh2.SETTINGS, 0, 0, b""))
        runtime = await accepted.get()
        runtime.speak()
        assert (await peer.read())[0] == rawh2.SETTINGS  # type: ignore[index]
        seen: list[int] = []
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.6):  # past the bound: no GOAWAY comes
                while (f := await peer.read()) is not None:
                    seen.append(f[0])
        assert rawh2.GOAWAY not in seen and told == [], seen
        await peer.close()
    finally:
        listener.stop_accepting()
        await listener.drain(0)
