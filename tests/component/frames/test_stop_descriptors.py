"""A stop with a client that reads nothing leaves the event loop watching no
closed descriptor.

Shutdown cancels the connections' handlers; a handler's socket is closed by
it only if no transport took it yet. Closed under a transport whose writes
still wait (a client that stopped reading), the descriptor stayed in the
loop's selector, and the next socket given that number could not be
watched: its transport failed to add its reader (``FileNotFoundError``) and
that connection hung. (Found when one component test's stuck connection
broke the next test's.)
"""

from __future__ import annotations

import asyncio
import os
import struct

from runtimeproxy.frames.frame import Setting

from .. import rawh2

V1_LIST = "/runtime.v1.RuntimeService/ListContainers"
MIB = 1024 * 1024


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


async def test_a_stop_with_a_client_that_reads_nothing_leaves_no_closed_descriptor_watched(
    fake, start_proxy, sock_dir
) -> None:
    fake.script(V1_LIST, response=b"\x0a" + b"a" * (4 * MIB))
    proxy = await start_proxy(fake.socket)
    # Windows wide open, then never a read: the answers pile up in the proxy's transport.
    peer = await rawh2.raw_with_settings(sock_dir / "proxy.sock", (Setting.INITIAL_WINDOW_SIZE, 1 << 30))
    peer.writer.write(rawh2.frame(rawh2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 30)))
    for sid in (1, 3, 5, 7):
        peer.writer.write(rawh2.grpc_call(sid, V1_LIST))
    await fake.wait_calls(V1_LIST, 4)
    connections = proxy._frames.listener._connections  # noqa: SLF001 - whether the transport holds writes
    async with asyncio.timeout(10):
        # No event tells of a transport's buffer filling; its high-water mark pauses the writes.
        while not any(not conn.client_can_write.is_set() for conn in connections):  # noqa: ASYNC110 - no event for a transport's buffer filling; bounded
            await asyncio.sleep(0.01)

    await proxy.stop(0)

    selector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]  # noqa: SLF001 - the loop's watch list
    assert [fd for fd in selector.get_map() if _closed(fd)] == []
    peer.writer.close()
