"""A FrameConnection driven frame by frame, with fake transports: the hooked
call's ends the component tests cannot time (frames/connection.py, upstream.py, hooked.py)."""

from __future__ import annotations

import asyncio
import gc
import struct
import weakref

import grpc
import hpack
import pytest

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import FrameConnection, Limits
from runtimeproxy.frames.frame import ErrorCode, Flag, FrameType
from tests.frameroutes import Routes
from tests.frametransport import Transport as _Transport  # (the name the modules beside this one import)

PODS = "/runtime.v1.RuntimeService/ListPodSandbox"


async def _pass_on(request, context, send):  # type: ignore[no-untyped-def]
    return await send(request)


class _Routes(Routes):
    """Every call hooked, its one stage passing the request on (subclasses
    with their own ``__init__`` call this one)."""

    def __init__(self) -> None:
        Routes.__init__(self, relayed=lambda path: False, stages=(_pass_on,))


def _connection(prefaced: bool = True) -> tuple[FrameConnection, _Transport, _Transport, hpack.Encoder]:
    """``prefaced``: the runtime's SETTINGS have come (before them the client is sent nothing)."""
    client, backend = _Transport(), _Transport()
    conn = FrameConnection(client, backend, _Routes(), None, Limits(max_message=100))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    if prefaced:
        conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    return conn, client, backend, hpack.Encoder()


def _headers(encoder: hpack.Encoder, sid: int) -> bytes:
    block = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", PODS), (":authority", "x"),
                            ("content-type", "application/grpc"), ("te", "trailers")])
    return fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, block)


def _data(sid: int, payload: bytes, end: bool = False) -> bytes:
    return fr.serialize(FrameType.DATA, Flag.END_STREAM if end else 0, sid, payload)


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def _written_frames_from(transport: _Transport, start: int) -> list[fr.Frame]:
    data, out, pos = b"".join(transport.written)[start:], [], 0
    while True:
        f, pos = fr.parse(data, pos, fr.MAX_FRAME_LIMIT)
        if f is None:
            return out
        out.append(f)


def _written_frames(transport: _Transport) -> list[fr.Frame]:
    data, out, pos = b"".join(transport.written), [], 0
    while True:
        f, pos = fr.parse(data, pos, fr.MAX_FRAME_LIMIT)
        if f is None:
            return out
        out.append(f)


async def test_a_hooked_call_refused_before_its_task_ran_frees_its_slot() -> None:
    conn, client, _, encoder = _connection()
    # Its header block and an oversized message in one read: refused at once.
    conn.client_data(_headers(encoder, 1) + _data(1, struct.pack(">BI", 0, 1000) + b"x" * 10))
    await _turns()
    assert conn.hooked == {} and conn.is_idle
    assert any(f.type == FrameType.HEADERS and f.stream_id == 1 for f in _written_frames(client))


async def test_a_connection_idle_again_is_busy_again_at_its_next_call() -> None:
    # The idle event is set or cleared only as it changes (FrameConnection.busy,
    # check_idle): one set without its state recorded would stay set here.
    conn, _, _, encoder = _connection()
    conn.client_data(_headers(encoder, 1) + _data(1, struct.pack(">BI", 0, 1000) + b"x" * 10))  # refused at once
    await _turns()
    assert conn.hooked == {} and conn.is_idle
    conn.client_data(_headers(encoder, 3) + _data(3, struct.pack(">BI", 0, 20) + b"x" * 10))  # half of it
    await _turns()
    assert 3 in conn.hooked and not conn.is_idle  # shutdown waits for it


async def test_a_hooked_request_cut_short_by_the_runtime_ends_its_call() -> None:
    conn, _, _, encoder = _connection()
    conn.client_data(_headers(encoder, 1) + _data(1, struct.pack(">BI", 0, 20) + b"x" * 10))  # half of it
    await _turns()
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0) + fr.rst_stream(1, ErrorCode.REFUSED_STREAM))
    conn.client_data(_data(1, b"y" * 10, end=True))  # the rest, already on its way: goes nowhere
    await _turns()
    assert conn.hooked == {} and conn.is_idle and not conn.closed.done()


async def test_a_unary_request_is_one_message_at_most() -> None:
    conn, client, _, encoder = _connection()
    small = struct.pack(">BI", 0, 60) + b"m" * 60  # under the limit, twice over it together
    conn.client_data(_headers(encoder, 1) + _data(1, small) + _data(1, small))
    await _turns()
    assert conn.hooked == {}
    ending = [f for f in _written_frames(client) if f.type == FrameType.HEADERS and f.stream_id == 1]
    assert ending and b"grpc-status" in b"".join(
        k for k, _ in hpack.Decoder().decode(bytes(ending[-1].payload), raw=True)
    )


async def test_the_streams_the_proxy_ended_are_remembered_within_a_bound() -> None:
    from runtimeproxy.frames import connection

    conn, _, _, _ = _connection()
    for sid in range(1, 2 * connection.ENDED_KEPT + 2, 2):
        conn.mark_ended(sid)
    assert len(conn.ended) <= connection.ENDED_KEPT
    assert 2 * connection.ENDED_KEPT + 1 in conn.ended and 1 not in conn.ended  # the newest kept


async def test_a_goaway_owed_before_the_runtimes_settings_follows_them() -> None:
    """A connection accepted just before the shutdown: the client's first frame
    must be the server's SETTINGS (the runtime's), so the GOAWAY waits for
    them, and the drain waits for the GOAWAY."""
    conn, client, _, _ = _connection(prefaced=False)
    conn.client_data(fr.serialize(FrameType.PING, 0, 0, b"12345678"))  # the proxy's answer waits too
    conn.begin_stop()
    await _turns()
    assert _written_frames(client) == [] and not conn.is_idle
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    await _turns()
    kinds = [f.type for f in _written_frames(client)]
    assert kinds[:2] == [FrameType.SETTINGS, FrameType.WINDOW_UPDATE] and FrameType.GOAWAY in kinds
    assert FrameType.PING in kinds
    assert conn.is_idle and not conn.closed.done()
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))  # later SETTINGS owe nothing more
    await _turns()
    assert [f.type for f in _written_frames(client)].count(FrameType.GOAWAY) == 1


async def test_a_stream_opened_after_the_proxys_goaway_is_refused_and_no_later_goaway_names_it() -> None:
    conn, client, backend, encoder = _connection()
    conn.begin_stop()
    conn.client_data(_headers(encoder, 1) + _data(1, struct.pack(">BI", 0, 0), end=True))
    conn.backend_data(fr.goaway(0, ErrorCode.NO_ERROR))  # the runtime goes away too: a second GOAWAY
    await _turns()
    frames = _written_frames(client)
    refused = [f for f in frames if f.type == FrameType.RST_STREAM and f.stream_id == 1]
    assert [int.from_bytes(f.payload, "big") for f in refused] == [ErrorCode.REFUSED_STREAM]
    assert [int.from_bytes(f.payload[:4], "big") for f in frames if f.type == FrameType.GOAWAY] == [0, 0]
    assert conn.hooked == {} and conn.diverted == {} and not conn.closed.done()  # the runtime never ran it
    assert fr.rst_stream(1, ErrorCode.CANCEL) in b"".join(backend.written)  # its HPACK decoder read the block


# -- a runtime that answers a diverted stream before it read the stream's RST_STREAM

VERSION = "/runtime.v1.RuntimeService/Version"
UNKNOWN_TO_RUNTIME = "/runtime.v1.RuntimeService/Status"  # say, a v1 call to a v1alpha2-only runtime


class _Diverting(_Routes):
    """Version is relayed; everything else the proxy answers itself (diverted)."""

    def fast(self, path: str) -> bool:
        return path == VERSION

    def hooked(self, path: str):  # type: ignore[no-untyped-def]
        return None


class _HeldAnswer:
    """The proxy's own answer to a diverted call (its local grpc.aio server), held until ``release``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self._cython_call = self

    def stream_stream(self, path: str):  # type: ignore[no-untyped-def]
        return lambda **_: self

    async def wait_for_connection(self) -> None:
        pass

    async def send_serialized_message(self, message: bytes) -> None:
        pass

    async def send_receive_close(self) -> None:
        pass

    async def initial_metadata(self) -> tuple[()]:
        await self.release.wait()
        return ()

    def __aiter__(self):  # type: ignore[no-untyped-def]
        return self._messages()

    async def _messages(self):  # type: ignore[no-untyped-def]
        yield b"proxy-answer"

    async def trailing_metadata(self) -> tuple[()]:
        return ()

    def cancel(self) -> None:
        pass


def _diverting_connection() -> tuple[FrameConnection, _Transport, hpack.Encoder, hpack.Encoder, _HeldAnswer]:
    conn, client, _, to_backend, backend_encoder, local = _diverting_connection_and_runtime()
    return conn, client, to_backend, backend_encoder, local


def _diverting_connection_and_runtime() -> tuple[
    FrameConnection, _Transport, _Transport, hpack.Encoder, hpack.Encoder, _HeldAnswer
]:
    """The connection, the client's and the runtime's transports, the client's and the runtime's encoders."""
    client, backend = _Transport(), _Transport()
    local = _HeldAnswer()
    conn = FrameConnection(client, backend, _Diverting(), local, Limits(max_message=100))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    return conn, client, backend, hpack.Encoder(), hpack.Encoder(), local


def _request(encoder: hpack.Encoder, sid: int, path: str) -> bytes:
    block = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                            ("content-type", "application/grpc"), ("te", "trailers")])
    return fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, block) + _data(sid, b"\0\0\0\0\0", end=True)


# grpc-go's answer to a method it does not know: trailers-only, and its encoder indexes these.
UNIMPLEMENTED = [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "12"),
                 ("grpc-message", "unknown service runtime.v1.RuntimeService")]


def _answer(encoder: hpack.Encoder, sid: int, headers: list[tuple[str, str]]) -> bytes:
    return fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, sid, encoder.encode(headers))


def _client_view(client: _Transport) -> list[tuple[int, int, dict[bytes, bytes]]]:
    """Header blocks as the client decodes them, in order: (stream, flags, headers)."""
    decoder, out = hpack.Decoder(), []
    for f in _written_frames(client):
        if f.type == FrameType.HEADERS:
            assert f.has(Flag.END_HEADERS)  # small blocks: one frame each
            out.append((f.stream_id, f.flags, dict(decoder.decode(bytes(f.payload), raw=True))))
    return out


async def test_a_runtimes_answer_to_a_diverted_first_stream_goes_on_a_stream_no_client_opens() -> None:
    conn, client, to_backend, backend_encoder, local = _diverting_connection()
    conn.client_data(_request(to_backend, 1, UNKNOWN_TO_RUNTIME) + _request(to_backend, 3, VERSION))
    await _turns()
    # The runtime answers stream 1 before it reads its RST_STREAM, then answers Version
    # with headers its encoder indexed in that first answer.
    conn.backend_data(_answer(backend_encoder, 1, UNIMPLEMENTED))
    conn.backend_data(_answer(backend_encoder, 3, [*UNIMPLEMENTED[:2], ("grpc-status", "0")]))
    await _turns()
    assert not conn.closed.done()
    # No stream is closed at the client yet: the block goes on stream 2 (a client opens odd
    # ones only), in order, and Version's answer is not held behind the proxy's own call.
    view = _client_view(client)
    assert [(sid, flags & Flag.END_STREAM) for sid, flags, _ in view] == [(2, 0), (3, Flag.END_STREAM)]
    assert view[0][2][b"grpc-status"] == b"12"  # decoded by the client, for HPACK's sake
    assert view[1][2][b"grpc-status"] == b"0" and view[1][2][b":status"] == b"200"  # the client's table held
    local.release.set()
    await _turns(10)
    on_1 = [hdrs for sid, _, hdrs in _client_view(client) if sid == 1]
    assert [h.get(b"grpc-status") for h in on_1] == [None, b"0"]  # only the proxy's answer, never the runtime's
    assert not any(f.type == FrameType.GOAWAY for f in _written_frames(client))


async def test_a_runtimes_answer_to_a_diverted_stream_goes_at_once_on_a_stream_closed_at_the_client() -> None:
    conn, client, to_backend, backend_encoder, local = _diverting_connection()
    conn.client_data(_request(to_backend, 1, VERSION))
    conn.backend_data(_answer(backend_encoder, 1, [*UNIMPLEMENTED[:2], ("grpc-status", "0")]))  # Version done
    conn.client_data(_request(to_backend, 3, UNKNOWN_TO_RUNTIME))
    await _turns()
    conn.backend_data(_answer(backend_encoder, 3, UNIMPLEMENTED))
    assert [(sid, hdrs.get(b"grpc-status")) for sid, _, hdrs in _client_view(client)] == [(1, b"0"), (1, b"12")]
    local.release.set()
    await _turns(10)
    answers_on_3 = [hdrs for sid, _, hdrs in _client_view(client) if sid == 3]
    assert [h.get(b"grpc-status") for h in answers_on_3] == [None, b"0"]  # headers, then the proxy's trailers
    assert not conn.closed.done()


async def test_a_bad_connection_window_update_from_the_client_still_ends_the_connection() -> None:
    """The relay loop takes a client's stream-0 WINDOW_UPDATE itself; one of 0,
    or of the wrong length, is still the connection error it was."""
    for payload, code in ((struct.pack(">I", 0), ErrorCode.PROTOCOL_ERROR),
                          (struct.pack(">I", 1) + b"\x00", ErrorCode.FRAME_SIZE_ERROR)):
        conn, client, _, _ = _connection()
        conn.client_data(fr.serialize(FrameType.WINDOW_UPDATE, 0, 0, payload))
        goaways = [f for f in _written_frames(client) if f.type == FrameType.GOAWAY]
        assert conn.closed.done() and [int.from_bytes(bytes(f.payload[4:8]), "big") for f in goaways] == [code]


async def test_a_clients_connection_window_update_grows_the_window_the_proxy_sends_under() -> None:
    conn, _, backend, _ = _connection()
    before = conn.out.window
    conn.client_data(fr.window_update(0, 1000))
    assert conn.out.window == before + 1000
    assert fr.window_update(0, 1000) not in b"".join(map(bytes, backend.written))  # per hop: not the runtime's


async def test_a_clients_stream_window_updates_reach_the_runtime_as_they_came_but_a_diverted_calls() -> None:
    """A gRPC client sends a stream's WINDOW_UPDATEs as it reads the answer,
    often after the stream ended: they pass in the relay's verbatim run, in
    order with what came around them. Only a diverted call's (the proxy
    answers it) are the proxy's."""
    conn, _, runtime, to_backend, backend_encoder, local = _diverting_connection_and_runtime()
    conn.client_data(_request(to_backend, 1, VERSION))
    conn.backend_data(_answer(backend_encoder, 1, [*UNIMPLEMENTED[:2], ("grpc-status", "0")]))  # stream 1 ends
    assert 1 not in conn.relayed
    conn.client_data(_request(to_backend, 3, UNKNOWN_TO_RUNTIME))  # diverted
    await _turns()
    sent = len(b"".join(map(bytes, runtime.written)))
    after_end, diverted = fr.window_update(1, 700), fr.window_update(3, 900)
    window = conn.diverted[3].window
    conn.client_data(after_end + diverted + fr.window_update(1, 300))
    passed = b"".join(map(bytes, runtime.written))[sent:]
    assert passed == after_end + fr.window_update(1, 300)
    assert conn.diverted[3].window == window + 900
    assert not conn.closed.done()
    client_sent = len(b"".join(map(bytes, conn._client_writer.written)))  # type: ignore[attr-defined]
    conn.client_data(fr.window_update(3, fr.MAX_WINDOW))  # over 2^31-1: that stream's error (RFC 9113 6.9.1)
    assert 3 not in conn.diverted or 3 in conn.ended
    resets = [f for f in _written_frames_from(conn._client_writer, client_sent) if f.type == FrameType.RST_STREAM]  # type: ignore[attr-defined]
    assert [(f.stream_id, int.from_bytes(f.payload, "big")) for f in resets] == [(3, ErrorCode.FLOW_CONTROL_ERROR)]
    assert not conn.closed.done()
    local.release.set()
    await _turns(10)


async def test_a_connection_error_before_the_runtimes_settings_sends_a_preface_and_the_goaway_only() -> None:
    conn, client, _, _ = _connection(prefaced=False)
    conn.client_data(fr.serialize(FrameType.PING, 0, 0, b"12345678"))  # its answer waits for the preface
    conn.client_data(fr.serialize(FrameType.DATA, 0, 1, b"x" * 16_385))  # over the frame size: a connection error
    await _turns()
    frames = _written_frames(client)
    assert [f.type for f in frames] == [FrameType.SETTINGS, FrameType.GOAWAY]
    assert frames[0].payload == b"" and conn.closed.done()


async def test_what_waits_for_the_runtimes_settings_is_bounded() -> None:
    from runtimeproxy.frames.upstream import MAX_HELD

    conn, client, _, _ = _connection(prefaced=False)
    pings = fr.serialize(FrameType.PING, 0, 0, b"12345678") * 1000
    for _ in range(MAX_HELD // len(pings) + 2):
        conn.client_data(pings)
        if conn.closed.done():
            break
    frames = _written_frames(client)
    assert conn.closed.done() and [f.type for f in frames] == [FrameType.SETTINGS, FrameType.GOAWAY]
    assert int.from_bytes(frames[1].payload[4:8], "big") == ErrorCode.ENHANCE_YOUR_CALM


@pytest.mark.parametrize("fragment", [b"", b"x"], ids=["empty", "one-byte"])
async def test_a_continuation_flood_ends_the_connection_at_once(fragment: bytes) -> None:
    """Empty CONTINUATIONs add nothing to a block's fragments: counted by
    frame (and header bytes) all the same, in constant time per frame."""
    from runtimeproxy.frames.upstream import MAX_BLOCK_FRAMES

    conn, client, _, _ = _connection()
    conn.client_data(fr.serialize(FrameType.HEADERS, 0, 1, b""))  # no END_HEADERS
    conn.client_data(fr.serialize(FrameType.CONTINUATION, 0, 1, fragment) * 50_000)
    await _turns()
    assert conn.closed.done()
    goaway = [f for f in _written_frames(client) if f.type == FrameType.GOAWAY]
    assert int.from_bytes(goaway[0].payload[4:8], "big") == ErrorCode.ENHANCE_YOUR_CALM
    assert MAX_BLOCK_FRAMES < 50_000


async def test_the_runtimes_continuation_flood_ends_the_connection_and_a_long_block_passes() -> None:
    """The runtime is bounded too (in frames and bytes), far above any block
    it sends: a block in 300 CONTINUATIONs still reaches the client."""
    from runtimeproxy.frames.downstream import MAX_RUNTIME_BLOCK_FRAMES

    conn, client, _, enc = _connection()
    conn.client_data(_headers(enc, 1) + _data(1, b"\0" * 5, end=True))
    await _turns()
    runtime = hpack.Encoder()
    block = runtime.encode([(":status", "200"), ("content-type", "application/grpc")])
    trailers = runtime.encode([("grpc-status", "0")])
    conn.backend_data(fr.serialize(FrameType.HEADERS, 0, 1, b"")
                      + fr.serialize(FrameType.CONTINUATION, 0, 1, b"") * 300
                      + fr.serialize(FrameType.CONTINUATION, Flag.END_HEADERS, 1, block)
                      + _data(1, b"\0" * 5)
                      + fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, trailers))
    await _turns(20)
    assert not conn.closed.done()
    assert [f.type for f in _written_frames(client)].count(FrameType.CONTINUATION) == 301
    conn.backend_data(fr.serialize(FrameType.HEADERS, 0, 1, b"")
                      + fr.serialize(FrameType.CONTINUATION, 0, 1, b"") * (MAX_RUNTIME_BLOCK_FRAMES + 1))
    await _turns()
    assert conn.closed.done()
    goaway = [f for f in _written_frames(client) if f.type == FrameType.GOAWAY]
    assert int.from_bytes(goaway[0].payload[4:8], "big") == ErrorCode.INTERNAL_ERROR
    assert b"header block from the backend" in bytes(goaway[0].payload[8:])


async def test_a_window_update_of_0_on_a_stream_resets_that_stream_only() -> None:
    conn, client, backend, enc = _connection()
    conn.client_data(_headers(enc, 1) + _headers(enc, 3) + fr.window_update(1, 0))
    await _turns()
    assert not conn.closed.done() and 3 in conn.hooked and 1 not in conn.hooked
    conn.client_data(_data(3, b"\0" * 5, end=True))  # 3's stage sends it: what waited for it goes too
    await _turns()
    resets = [f for f in _written_frames(client) if f.type == FrameType.RST_STREAM]
    assert [(f.stream_id, int.from_bytes(f.payload, "big")) for f in resets] == [(1, ErrorCode.PROTOCOL_ERROR)]
    backend.written[0] = bytes(backend.written[0])[len(fr.PREFACE):]
    assert [f.stream_id for f in _written_frames(backend) if f.type == FrameType.RST_STREAM] == [1]
    conn.client_data(fr.window_update(0, 0))  # on the connection: a connection error
    assert conn.closed.done()


async def test_a_window_update_of_0_from_the_runtime_ends_that_call_only() -> None:
    conn, client, backend, enc = _connection()
    conn.client_data(_headers(enc, 1) + _headers(enc, 3))
    await _turns()
    conn.backend_data(fr.window_update(1, 0))
    await _turns()
    assert not conn.closed.done() and 1 in conn.ended and 3 in conn.hooked
    resets = [(f.stream_id, int.from_bytes(f.payload, "big"))
              for f in _written_frames_from(backend, len(fr.PREFACE)) if f.type == FrameType.RST_STREAM]
    # The runtime is told the call is over (it holds no state for stream 1),
    # as the stream error RFC 9113 6.9 names: PROTOCOL_ERROR, not CANCEL.
    assert resets == [(1, ErrorCode.PROTOCOL_ERROR)]
    ends = [f for f in _written_frames(client) if f.stream_id == 1]
    assert ends and ends[-1].flags & Flag.END_STREAM
    assert dict(hpack.Decoder().decode(bytes(ends[-1].payload), raw=True))[b"grpc-status"] == b"13"


@pytest.mark.parametrize("table", [0, 1000])
async def test_the_proxys_own_block_after_the_client_shrank_its_table_says_so(table: int) -> None:
    """RFC 7541 4.2: the first block after the ACK of a smaller
    HEADER_TABLE_SIZE starts with a size update, and it may be the proxy's."""
    client, backend = _Transport(), _Transport()
    conn = FrameConnection(client, backend, _Routes(), None, Limits(max_message=100))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0, struct.pack(">HI", fr.Setting.HEADER_TABLE_SIZE, table)))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0) + fr.serialize(FrameType.SETTINGS, Flag.ACK, 0))
    encoder = hpack.Encoder()
    conn.client_data(_headers(encoder, 1) + _headers(encoder, 3))
    await _turns()
    conn.end_hooked(1, grpc.StatusCode.INTERNAL, "refused")  # a block of the proxy's own
    conn.end_hooked(3, grpc.StatusCode.INTERNAL, "refused")  # and another: each may come first
    decoder = hpack.Decoder()
    decoder.max_allowed_table_size = table  # as the client applies it, once acknowledged
    blocks = [f for f in _written_frames(client) if f.type == FrameType.HEADERS]
    assert [dict(decoder.decode(bytes(f.payload), raw=True))[b"grpc-status"] for f in blocks] == [b"13", b"13"]


class _Recording(_Routes):
    """Every call hooked, its stage recording what the call's context says."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[tuple[tuple[str, str | bytes], ...], float | None]] = []

    def hooked(self, path: str):  # type: ignore[no-untyped-def]
        async def record(request, context, send):  # type: ignore[no-untyped-def]
            self.seen.append((context.invocation_metadata(), context.time_remaining()))
            return await send(request)
        return (record,)


async def test_a_hooked_calls_block_that_adds_to_the_table_is_read_once_and_whole() -> None:
    """gRPC clients index each new grpc-timeout value they send (grpc-go a
    deadline under 100 s in microseconds: a new value each call). The proxy's
    reader takes such a block itself (hpackpeek), so the call's metadata and
    deadline come from that one reading, and the table stays in step for the
    blocks after it."""
    client, backend = _Transport(), _Transport()
    routes = _Recording()
    conn = FrameConnection(client, backend, routes, None, Limits(max_message=100))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    backend.written.clear()  # the preface and SETTINGS
    encoder, runtime_decoder = hpack.Encoder(), hpack.Decoder()
    fields = [(":method", "POST"), (":scheme", "http"), (":path", PODS), (":authority", "x"),
              ("content-type", "application/grpc"), ("te", "trailers"), ("x-request", "kubelet")]
    for sid, timeout in ((1, "99999000u"), (3, "20S"), (5, "7M")):  # (at most 8 digits, as grpc-go writes)
        block = encoder.encode([*fields, ("grpc-timeout", timeout)])
        if sid > 1:  # refers to the table for the fields, then adds its grpc-timeout
            assert all(b & 0x80 for b in block[:len(fields)]) and block[len(fields)] & 0xC0 == 0x40
        conn.client_data(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, block)
                         + _data(sid, b"\0\0\0\0\0", end=True))
        await _turns()
        blocks = [f for f in _written_frames(backend) if f.type == FrameType.HEADERS]
        backend.written.clear()
        assert [dict(runtime_decoder.decode(bytes(f.payload), raw=True))[b"grpc-timeout"] for f in blocks] == [
            timeout.encode()]  # the runtime's decoder, in step with the client's encoder
    assert [metadata for metadata, _ in routes.seen] == [(("x-request", "kubelet"),)] * 3
    assert [round(remaining or 0) for _, remaining in routes.seen] == [100, 20, 420]
    proxy_table = conn.client_side.headers._decoder.header_table.dynamic_entries
    assert list(proxy_table) == list(runtime_decoder.header_table.dynamic_entries)  # each block added once


async def test_a_closed_connection_is_freed_at_once() -> None:
    """A gate's time limit is on a timer of the loop's, which holds the
    connection until then (a second on); closed, the connection drops it."""
    conn, client, backend, _ = _connection()
    conn.out.gate(_data(1, b"x"), 60, lambda: False)  # (as a hooked call's answer waits for its window)
    conn.lost()
    assert client.closed and backend.closed
    alive = weakref.ref(conn)
    del conn
    gc.collect()  # (its parts and it refer to each other)
    assert alive() is None
