"""A client that writes PINGs and never reads: the proxy buffers its answers
up to a bound, then stops reading it; once it reads, every PING is answered
and the connection serves on."""

from __future__ import annotations

import asyncio

import pytest
from grpc import aio

from runtimeproxy.frames import connection as connection_module

from .. import rawh2

V1_VERSION = "/runtime.v1.RuntimeService/Version"
BACKLOG = 1 << 18  # the bound, lowered for a test that must also read every answer back
PING = rawh2.frame(rawh2.PING, 0, 0, b"12345678")
PINGS = 16 * BACKLOG // len(PING)  # 4 MiB: more than the buffers between the two can hold


async def test_a_client_that_never_reads_is_held_then_answered_in_full(
    fake, start_proxy, sock_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection_module, "CLIENT_BACKLOG", BACKLOG)
    proxy = await start_proxy(fake.socket)
    peer = await rawh2.raw_with_settings(sock_dir / "proxy.sock")
    writing = asyncio.create_task(_write(peer.writer, PING * PINGS))
    (conn,) = proxy._frames.listener._connections  # noqa: SLF001 - how much the transport holds
    async with asyncio.timeout(20):
        # No event tells of a transport's buffer filling, or of reads paused for it.
        while "backlog" not in conn._client_reads_held:  # noqa: SLF001, ASYNC110 - no event for reads held; bounded
            await asyncio.sleep(0.01)
    held = conn._client_writer.get_write_buffer_size()  # noqa: SLF001
    assert BACKLOG < held < 2 * BACKLOG  # answers to one read past the bound, not 16 MiB
    assert not writing.done()  # its writes wait

    acks = await _read_acks(peer, PINGS)  # reading lets it go on
    await writing
    assert acks == PINGS
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as channel:
        fake.script(V1_VERSION, response=b"")
        await channel.unary_unary(V1_VERSION)(b"", timeout=10)  # and the proxy serves on
    await peer.close()


async def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


async def _read_acks(peer: rawh2.RawPeer, wanted: int) -> int:
    """PING ACKs read until ``wanted`` came (frames parsed in bulk: there are many)."""
    buf, acks = b"", 0
    async with asyncio.timeout(60):
        while acks < wanted:
            buf += await peer.reader.read(1 << 20)
            pos = 0
            while len(buf) - pos >= 9 and len(buf) - pos >= 9 + int.from_bytes(buf[pos:pos + 3], "big"):
                size = int.from_bytes(buf[pos:pos + 3], "big")
                acks += buf[pos + 3] == rawh2.PING and buf[pos + 4] & rawh2.ACK
                pos += 9 + size
            buf = buf[pos:]
    return acks
