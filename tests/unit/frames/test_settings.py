"""SETTINGS across the proxy (frames/frame.py AckedSetting, settings.py, downstream.py,
upstream.py): a peer's new MAX_FRAME_SIZE applies once acknowledged, and
that acknowledgement comes from the other side of the proxy. So the proxy
frames what it makes under every value still in play, and an ACK never
overtakes DATA framed before it."""

from __future__ import annotations

import struct

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import AckedSetting, Flag, FrameType, Setting

from .test_connection import VERSION, _written_frames, _data, _Transport
from .test_relayed_frames import OK, _connection

ACK = fr.serialize(FrameType.SETTINGS, Flag.ACK, 0)


def _settings(**values: int) -> bytes:
    return fr.serialize(FrameType.SETTINGS, 0, 0, b"".join(struct.pack(">HI", Setting[k], v) for k, v in values.items()))


def _frames(written: list[bytes]) -> list[fr.Frame]:
    data, out, pos = b"".join(written), [], 0
    while (parsed := fr.parse(data, pos, fr.MAX_FRAME_LIMIT))[0] is not None:
        f, pos = parsed
        out.append(f)
    return out


def test_a_new_max_frame_size_is_used_once_acknowledged_and_taken_from_the_moment_it_is_announced() -> None:
    sizes = AckedSetting(fr.DEFAULT_MAX_FRAME)
    sizes.announced(1 << 20)  # larger: the peer still takes only 16 KiB until its ACK
    assert (sizes.send, sizes.relay) == (16_384, 1 << 20)
    sizes.announced(None)  # a SETTINGS without it
    sizes.announced(20_000)
    assert (sizes.send, sizes.relay) == (16_384, 1 << 20)
    sizes.acknowledged()
    assert (sizes.send, sizes.relay) == (20_000, 1 << 20)  # 20 000 is announced, not yet acknowledged
    sizes.acknowledged()
    sizes.acknowledged()
    assert (sizes.send, sizes.relay) == (20_000, 20_000)
    sizes.acknowledged()  # an ACK for nothing changes nothing
    assert (sizes.send, sizes.relay) == (20_000, 20_000)


async def test_the_proxy_frames_for_the_client_under_its_acknowledged_max_frame_size() -> None:
    conn, _, _, _, _ = _connection()
    conn.backend_data(ACK)  # of the client's first SETTINGS (in its preface)
    conn.client_data(_settings(MAX_FRAME_SIZE=1 << 20))  # the client raises it (C-core does, with its BDP)
    assert conn.client_frames.send == 16_384  # the client takes larger frames only once it has the ACK
    conn.backend_data(ACK)  # the runtime acknowledges it, through the proxy
    assert conn.client_frames.send == 1 << 20


async def test_the_runtimes_ack_stays_behind_data_queued_for_the_clients_window() -> None:
    conn, client, _, to_backend, backend_encoder = _connection(max_message=1 << 20)
    conn.client_data(_settings(MAX_FRAME_SIZE=20_000))
    conn.client_data(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, to_backend.encode(
        [(":method", "POST"), (":scheme", "http"), (":path", VERSION), (":authority", "x"),
         ("content-type", "application/grpc"), ("te", "trailers")])) + _data(1, b"\0" * 5, end=True))
    big = fr.DEFAULT_WINDOW + 100  # more than the client's connection window (never raised here)
    head = fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, backend_encoder.encode(OK[:2]))
    conn.backend_data(head + b"".join(fr.data_frames(1, b"\0" + big.to_bytes(4, "big") + b"x" * big, 16_384, False)))
    assert conn.out.queued
    conn.backend_data(ACK)  # the client may take smaller frames only from here on
    conn.client_data(fr.window_update(0, 1 << 20))
    kinds = [f.type for f in _written_frames(client) if f.type in (FrameType.DATA, FrameType.SETTINGS)]
    assert kinds[-1] == FrameType.SETTINGS and kinds.count(FrameType.DATA) > 1  # all the DATA, then the ACK


async def test_the_clients_ack_stays_behind_data_queued_for_the_runtimes_window() -> None:
    backend = _Transport()
    conn, _, _, to_backend, _ = _connection(max_message=1 << 20)
    conn.backend._transport = backend  # noqa: SLF001 - what reaches the runtime from here on
    big = fr.DEFAULT_WINDOW + 100  # more than the runtime's connection window (never raised here)
    conn.client_data(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, to_backend.encode(
        [(":method", "POST"), (":scheme", "http"), (":path", VERSION), (":authority", "x"),
         ("content-type", "application/grpc"), ("te", "trailers")]))
        + b"".join(fr.data_frames(1, b"\0" + big.to_bytes(4, "big") + b"x" * big, 16_384, True)))
    assert conn.inbound.queued
    conn.client_data(ACK)  # of the runtime's SETTINGS: the runtime may enforce them from here on
    conn.backend_data(fr.window_update(0, 1 << 20))
    kinds = [f.type for f in _frames(backend.written) if f.type in (FrameType.DATA, FrameType.SETTINGS)]
    assert kinds[-1] == FrameType.SETTINGS and kinds.count(FrameType.DATA) > 1


async def test_a_larger_runtime_window_counts_for_the_proxys_own_data_once_the_client_acknowledged_it() -> None:
    """C-core resets a stream (PROTOCOL_ERROR) whose DATA overflows the window it
    knows acknowledged, and the ACK of its SETTINGS comes from the client: the
    proxy's own DATA (a hooked request) waits for that ACK to use a larger
    window; a smaller one counts at once."""
    from runtimeproxy.frames import hooked

    conn, _, _, _, _ = _connection()
    conn.client_data(ACK)  # of the runtime's first SETTINGS
    call = hooked.Hooked(1, "/p", [], (), window=conn.backend_windows.send)
    conn.hooked[1] = call
    conn.backend_data(_settings(INITIAL_WINDOW_SIZE=1 << 22))  # larger, on its way to the client
    assert conn.backend_windows.send == call.window == fr.DEFAULT_WINDOW
    conn.client_data(ACK)  # the client acknowledges it; the ACK goes to the runtime first
    assert conn.backend_windows.send == call.window == 1 << 22
    conn.backend_data(_settings(INITIAL_WINDOW_SIZE=1 << 16))  # smaller: at once
    assert conn.backend_windows.send == call.window == 1 << 16
    conn.client_data(ACK)
    assert conn.backend_windows.send == call.window == 1 << 16
