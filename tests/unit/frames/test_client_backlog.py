"""A client that writes and never reads (PINGs, say) has its answers buffered
only up to a bound: past it, its reads wait until it reads again."""

from __future__ import annotations

import hpack
import pytest

from runtimeproxy.frames import connection as connection_module
from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import FrameConnection, Limits
from runtimeproxy.frames.frame import FrameType

from .test_connection import _Diverting, _HeldAnswer, _request, _Routes, _Transport, _turns

STATUS = "/runtime.v1.RuntimeService/Status"

PINGS = fr.serialize(FrameType.PING, 0, 0, b"12345678") * 4096  # 68 KiB of PINGs, as one read
BACKLOG = 1 << 18  # the bound, lowered: 4 MiB of PINGs take seconds to answer here


@pytest.fixture(autouse=True)
def _small_backlog(monkeypatch: pytest.MonkeyPatch) -> None:
    assert connection_module.CLIENT_BACKLOG == 4 << 20
    monkeypatch.setattr(connection_module, "CLIENT_BACKLOG", BACKLOG)


class _Unread(_Transport):
    """A client transport whose peer reads nothing: what is written stays buffered."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self.written))

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def _connection() -> tuple[FrameConnection, _Unread]:
    client = _Unread()
    conn = FrameConnection(client, _Transport(), _Routes(), None, Limits(max_message=100))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.client_writable(False)  # as its transport says past its high-water mark
    return conn, client


def _flood(conn: FrameConnection, client: _Unread) -> None:
    """PINGs as the proxy reads them, until it stops reading."""
    for _ in range(BACKLOG // len(PINGS) * 2):
        conn.client_data(PINGS)
        if not client.reading:
            return
    raise AssertionError(f"still reading with {client.get_write_buffer_size()} bytes unsent")


async def test_a_client_that_never_reads_is_held_at_the_backlog_and_let_go_as_it_reads() -> None:
    conn, client = _connection()
    _flood(conn, client)
    assert BACKLOG < client.get_write_buffer_size() <= BACKLOG + len(PINGS)  # every PING answered
    assert not conn.closed.done()
    conn.client_writable(True)  # it read
    assert client.reading


async def test_its_reads_wait_while_any_reason_holds_them() -> None:
    conn, client = _connection()
    conn.backend_writable(False)  # the runtime's transport is full too
    assert not client.reading
    conn.client_data(PINGS * (BACKLOG // len(PINGS) + 1))  # (what the transport had read already)
    conn.client_writable(True)
    assert not client.reading  # still for the runtime
    conn.backend_writable(True)
    assert client.reading
    conn.backend_writable(False)
    conn.backend_writable(True)
    assert client.reading


async def test_reads_held_for_a_runtime_that_is_gone_go_on() -> None:
    """A diverted call keeps the client's connection once the runtime's is
    gone: the client is read again, whatever the runtime's full transport held."""
    client = _Unread()
    conn = FrameConnection(client, _Transport(), _Diverting(), _HeldAnswer(), Limits(max_message=100))
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.client_data(_request(hpack.Encoder(), 1, STATUS))  # diverted: the proxy answers it
    await _turns()
    conn.backend_writable(False)
    assert not client.reading
    conn.backend_gone()
    assert not conn.closed.done() and conn.diverted
    assert client.reading
