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


def _goes_away(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return _lines(caplog, "the runtime goes away")


async def test_a_drains_info_line_is_the_goaway_that_refuses(sock_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """grpc-go drains (GracefulStop, MaxConnectionAge) with two GOAWAYs: a
    heads-up naming stream 2**31-1, a PING, then the one that names its last
    stream. The info line is that one's, with what it refused; the heads-up
    is at debug. Before: the heads-up's was the info line (last_stream
    2147483647, refused 0), and neither said its code nor debug data."""
    caplog.set_level(logging.DEBUG, logger="runtimeproxy.frames")
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        pair.client.writer.write(pair.request(1, RELAYED, body=None, end=False)
                                 + pair.request(3, RELAYED, body=None, end=False))
        await pair.runtime.until(rawh2.HEADERS, 3)
        pair.runtime.writer.write(fr.goaway(2**31 - 1, ErrorCode.NO_ERROR))
        await pair.client.until(rawh2.GOAWAY)
        pair.runtime.writer.write(fr.goaway(1, ErrorCode.NO_ERROR, b"drained"))
        seen = await pair.pinged()
        assert (rawh2.RST_STREAM, 3, ErrorCode.REFUSED_STREAM) in rawh2.errors(seen)
    assert [(r.levelname, r.last_stream) for r in _goes_away(caplog)] == [("DEBUG", 2**31 - 1), ("INFO", 1)]
    [info] = [r for r in _goes_away(caplog) if r.levelno == logging.INFO]
    assert (info.refused, info.code, info.debug) == (1, "NO_ERROR", "drained")
    assert info.client_pid == os.getpid()


async def test_a_goaway_for_too_many_pings_says_so(sock_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """grpc-go's keepalive enforcement goes away with ENHANCE_YOUR_CALM and
    'too_many_pings': one info line with them, told apart from a drain; the
    debug data cut short and read leniently (a runtime's bytes need not be UTF-8)."""
    caplog.set_level(logging.INFO, logger="runtimeproxy.frames")
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        pair.client.writer.write(pair.request(1, RELAYED, body=None, end=False))
        await pair.runtime.until(rawh2.HEADERS, 1)
        pair.runtime.writer.write(fr.goaway(1, ErrorCode.ENHANCE_YOUR_CALM, b"too_many_pings\xff" + b"x" * 1000))
        await pair.client.until(rawh2.GOAWAY)
        pair.runtime.writer.write(fr.goaway(1, ErrorCode.ENHANCE_YOUR_CALM, b"again"))  # a repeat: at debug
        await pair.pinged()
    [info] = _goes_away(caplog)
    assert (info.last_stream, info.refused, info.code) == (1, 0, "ENHANCE_YOUR_CALM")
    assert info.debug == "too_many_pings\ufffd" + "x" * 185  # its first 200 bytes


async def test_a_heads_up_the_runtime_closes_after_is_the_info_line(
    sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A drain cut short: grpc-go's heads-up GOAWAY (stream 2**31-1), then the
    runtime closes without the second one. Its close gives the heads-up's
    info line, naming it, once. Before: the heads-up stayed at debug and no
    line at info said the runtime went away."""
    caplog.set_level(logging.DEBUG, logger="runtimeproxy.frames")
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        pair.client.writer.write(pair.request(1, RELAYED, body=None, end=False))
        await pair.runtime.until(rawh2.HEADERS, 1)
        pair.runtime.writer.write(fr.goaway(2**31 - 1, ErrorCode.NO_ERROR, b"graceful_stop"))
        await pair.client.until(rawh2.GOAWAY)
        pair.runtime.writer.close()
        assert await pair.client.read() is None  # the call in flight: the client's connection closes too
    assert [(r.levelname, r.last_stream) for r in _goes_away(caplog)] == [("DEBUG", 2**31 - 1), ("INFO", 2**31 - 1)]
    [info] = [r for r in _goes_away(caplog) if r.levelno == logging.INFO]
    assert "heads-up GOAWAY" in info.getMessage() and "closed the connection" in info.getMessage()
    assert (info.code, info.debug, info.client_pid) == ("NO_ERROR", "graceful_stop", os.getpid())
