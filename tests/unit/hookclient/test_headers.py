"""The hook client's header blocks and answer statuses (hookclient/headers.py): the request's
grpc-timeout, remembered per millisecond value, encodes as it is built anew each time, and an
answer's grpc-message is read as gRPC reads it, with or without percent-escapes."""

from __future__ import annotations

import grpc
import hpack
import pytest

from runtimeproxy.frames.hpackstatic import field
from runtimeproxy.hookclient import headers
from runtimeproxy.hookclient.headers import grpc_status, with_timeout

PREFIX = headers.request_block_prefix("/runtime.v1alpha1.RuntimeHookService/PreStartContainerHook")


@pytest.mark.parametrize("seconds", [0.0, 0.0004, 0.001, 2.5, 9.9994, 10.0, 99_999.9999, 100_000.0, 3e9])
def test_a_timeout_encodes_the_same_remembered_or_not(seconds: float) -> None:
    millis = max(1, int(seconds * 1000))
    value = b"%dm" % millis if millis < 100_000_000 else b"%dS" % min(99_999_999, int(seconds))
    expected = PREFIX + field(b"grpc-timeout", value)
    headers._TIMEOUTS.clear()
    assert with_timeout(PREFIX, seconds) == expected  # built
    assert with_timeout(PREFIX, seconds) == expected  # remembered
    assert dict(hpack.Decoder().decode(expected, raw=True))[b"grpc-timeout"] == value


def test_the_timeouts_remembered_are_bounded() -> None:
    headers._TIMEOUTS.clear()
    for millis in range(1, 3 * headers.TIMEOUTS_KEPT):
        with_timeout(PREFIX, millis / 1000)
        assert len(headers._TIMEOUTS) <= headers.TIMEOUTS_KEPT
    assert with_timeout(PREFIX, 0.001) == PREFIX + field(b"grpc-timeout", b"1m")


@pytest.mark.parametrize(("raw", "message"), [
    (b"", ""),
    (b"no escapes here", "no escapes here"),
    (b"50%25 done%3A %E2%9C%93", "50% done: \u2713"),  # percent-encoded UTF-8, as gRPC sends it
    (b"bad %zz escape", "bad %zz escape"),
    (b"caf\xe9", "caf\xe9"),  # a byte that is not UTF-8, read as latin-1
])
def test_an_answers_message_is_read_as_grpc_reads_it(raw: bytes, message: str) -> None:
    assert grpc_status({b"grpc-status": b"13", b"grpc-message": raw}) == (grpc.StatusCode.INTERNAL, message)
    assert grpc_status({b"grpc-status": b"0", b"grpc-message": raw})[1] == message
