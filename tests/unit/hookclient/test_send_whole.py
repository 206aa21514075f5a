"""A hook call's request written in one go when both windows take it (ClientConnection._send_whole)
is byte for byte what the general sender (_send) writes, and neither sends what the windows refuse."""

from __future__ import annotations

import asyncio

import pytest

from runtimeproxy.frames import frame as fr
from runtimeproxy.hookclient.connection import ClientConnection
from runtimeproxy.hookclient.headers import request_block_prefix, with_timeout
from runtimeproxy.hookclient.stream import Stream


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return False


def _connection(max_frame: int, table_update: bool) -> tuple[ClientConnection, _Transport]:
    conn = ClientConnection("hook.sock", 1 << 24, lambda _: None)
    transport = _Transport()
    conn._transport = transport  # type: ignore[assignment]
    conn._server.max_frame = max_frame
    conn._server.send_window = conn._server.stream_window = 1 << 22
    conn._table_update = table_update
    return conn, transport


def _stream(conn: ClientConnection, window: int) -> Stream:
    return Stream(1, window, asyncio.get_running_loop().create_future(), 1 << 24)


@pytest.mark.parametrize("table_update", [False, True])
@pytest.mark.parametrize("block_size", [0, 60, 16_384, 16_385, 40_000])
@pytest.mark.parametrize("message_size", [0, 300, 16_379, 16_380, 70_000])
async def test_a_request_both_windows_take_is_written_as_the_general_sender_writes_it(
        table_update: bool, block_size: int, message_size: int) -> None:
    block = (with_timeout(request_block_prefix("/runtime.v1alpha1.RuntimeHookService/PreCreateContainerHook"), 9.999)
             * 400)[:block_size]
    payload = b"\0" + message_size.to_bytes(4, "big") + bytes(range(256)) * (message_size // 256) \
        + bytes(message_size % 256)
    whole, whole_out = _connection(fr.DEFAULT_MAX_FRAME, table_update)
    general, general_out = _connection(fr.DEFAULT_MAX_FRAME, table_update)
    stream, other = _stream(whole, 1 << 22), _stream(general, 1 << 22)
    assert whole._send_whole(stream, block, payload)
    await general._send(other, block, payload)
    assert b"".join(whole_out.written) == b"".join(general_out.written)
    assert len(whole_out.written) == 1  # one write
    assert (stream.window, stream.request_sent, whole._table_update) == (other.window, True, False)
    assert whole._server.send_window == general._server.send_window


@pytest.mark.parametrize("short", ["stream", "connection", "paused"])
async def test_a_request_a_window_cannot_take_whole_is_left_to_the_general_sender(short: str) -> None:
    conn, out = _connection(fr.DEFAULT_MAX_FRAME, True)
    payload = b"\0\0\0\0\x0bhello there"
    stream = _stream(conn, len(payload) - 1 if short == "stream" else 1 << 20)
    if short == "connection":
        conn._server.send_window = len(payload) - 1
    conn._paused = short == "paused"
    windows = (stream.window, conn._server.send_window)
    assert not conn._send_whole(stream, b"block", payload)
    assert out.written == [] and conn._table_update  # nothing sent, nothing spent
    assert (stream.window, conn._server.send_window) == windows and not stream.request_sent
