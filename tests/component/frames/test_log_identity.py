"""Every line about one frames connection names its client (peerid.py):
``client_pid``, the client's process, and ``client_fd``, the proxy's
descriptor of its socket, read once as the connection is set up, so the
lines logged as it closes, when the socket can no longer be asked, still
carry them.

Before: only the line about restating the client's header blocks had them;
an operator could not tell which client a connection error, a stream reset
or the runtime's GOAWAY was about.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import ErrorCode, FrameType

from .. import rawh2
from .rawrelay import RELAYED, raw_relay


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


async def test_a_connections_lines_name_its_client(sock_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="runtimeproxy.frames")
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        # A stream error: the stream's reset is logged.
        pair.client.writer.write(pair.request(1, RELAYED, body=None, end=False) + fr.window_update(1, 0))
        assert rawh2.errors(await pair.pinged()) == [(rawh2.RST_STREAM, 1, ErrorCode.PROTOCOL_ERROR)]
        # The runtime goes away, then the client breaks the protocol: a connection error.
        pair.runtime.writer.write(fr.goaway(1, ErrorCode.NO_ERROR))
        assert rawh2.errors(await pair.client.until(rawh2.GOAWAY)) == [(rawh2.GOAWAY, 0, ErrorCode.NO_ERROR)]
        pair.client.writer.write(fr.serialize(FrameType.CONTINUATION, 0x4, 3, b""))
        assert await pair.client.goaway_code() == ErrorCode.PROTOCOL_ERROR
    # (the relay drained: the connection's handler, which logs its close, is done)
    lines = [_lines(caplog, text) for text in (
        "client connection relayed to the runtime",
        "stream reset for a protocol error of the client's",
        "the runtime goes away",
        "connection error, client side",
        "relayed client connection closed",
    )]
    assert [len(found) for found in lines] == [1, 1, 1, 1, 1]
    opened = lines[0][0]
    assert opened.client_pid == os.getpid()  # this process is the client
    assert isinstance(opened.client_fd, int) and opened.client_fd >= 0
    # The same client on each, the close's included (its socket closed by then).
    assert [(r.client_pid, r.client_fd) for [r] in lines] == [(opened.client_pid, opened.client_fd)] * 5
    assert (lines[1][0].stream, lines[2][0].last_stream, lines[3][0].code) == (1, 1, "PROTOCOL_ERROR")


async def test_the_runtimes_close_names_the_client(sock_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy.frames")
    async with raw_relay(sock_dir) as relay:
        first = await relay.pair()
        second = await relay.pair()
        second.client.writer.write(second.request(1, RELAYED, body=None, end=False))
        await second.runtime.until(rawh2.HEADERS, 1)
        second.runtime.writer.close()  # with the call in flight: the client's connection closes too
        assert await second.client.read() is None
        first.runtime.writer.close()  # idle
        assert await first.client.read() is None
    [closed] = _lines(caplog, "runtime connection closed with calls in flight")
    assert closed.client_pid == os.getpid() and closed.relayed == 1
    assert isinstance(closed.client_fd, int) and closed.client_fd >= 0
    assert _lines(caplog, "runtime connection closed") == [closed]  # the idle one's close is not a line of its own
