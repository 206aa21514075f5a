"""Flow control under pressure, on both data paths (tests/component/grpcpath/).

Many 1-15 MiB messages on relayed and staged streams of one connection
arrive whole, with the client's windows wide or tiny; a client that stops
reading one stream holds up no other; a runtime that stops reading one
call's large request holds up no other call on the client's connection; a
runtime advertising tiny windows gets large messages whole, in frames and
windows it accepts (grpc core answers anything else with a connection
error, which would fail every call under way); a staged call's large answer
is not held for its stages, which wait for all of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
from grpc import aio

from runtimeproxy.cripath.stage import StageProvider
from runtimeproxy.frames import downstream

from ..fakes import FakeBackend

V1_LIST = "/runtime.v1.RuntimeService/ListContainers"
V1_PODS = "/runtime.v1.RuntimeService/ListPodSandbox"
V1_STATUS = "/runtime.v1.RuntimeService/ContainerStatus"
MIB = 1024 * 1024
WIDE = [("grpc.max_receive_message_length", 64 * MIB), ("grpc.max_send_message_length", 64 * MIB)]
# What grpc core advertises with these: 1 KiB stream windows that never grow.
TINY_WINDOWS = (("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024))


@pytest.fixture(autouse=True)
def no_connection_error(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No protocol or flow-control error on either hop, read from the proxy's own
    log (a connection error there is a warning), beside every call succeeding."""
    caplog.set_level(logging.WARNING, logger="runtimeproxy")
    yield
    warned = [r.getMessage() for r in caplog.get_records("call")
              if r.name.startswith("runtimeproxy") and r.levelno >= logging.WARNING]
    assert warned == []


class Staged(StageProvider):
    """A stage with work on every ListPodSandbox: those calls take the proxy's own
    path. With ``recording_s``, it takes that long to record a call once the
    runtime answered (time the proxy has to, wrongly, let the answer go meanwhile)."""

    def __init__(self, recording_s: float = 0.0) -> None:
        self.recording_s = recording_s
        self.seen = 0
        self.answered = asyncio.Event()
        self.recorded = False

    def stage_for(self, method, client_version, backend_version):  # type: ignore[no-untyped-def]
        if method != "ListPodSandbox":
            return None

        async def stage(request, context, send):  # type: ignore[no-untyped-def]
            self.seen += 1
            reply = await send(request)
            self.answered.set()
            if self.recording_s:
                await asyncio.sleep(self.recording_s)  # the work of recording, not a wait for an event
            self.recorded = True
            return reply

        return stage


def _body(mib: int, salt: int) -> bytes:
    return bytes([salt, salt ^ 0x5A]) * (mib * MIB // 2 - 32)


async def _echoes(channel: aio.Channel, sizes: list[int], timeout: float) -> None:
    """Relayed and staged calls of ``sizes`` MiB at once, each answered with its own bytes."""

    async def one(path: str, mib: int, salt: int) -> None:
        body = _body(mib, salt)
        assert await channel.unary_unary(path)(body, timeout=timeout) == body

    await asyncio.gather(*(one(V1_LIST if i % 2 else V1_PODS, mib, i) for i, mib in enumerate(sizes)))


async def test_a_runtime_that_stops_reading_one_call_holds_up_no_other(fake, start_proxy, sock_dir) -> None:
    fake.script(V1_LIST, echo=True)
    fake.script(V1_PODS, echo=True)
    fake.script(V1_STATUS, echo=True, read_after_release=True)
    staged = Staged()
    await start_proxy(fake.socket, stages=(staged,))
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=WIDE) as channel:
        held_body = _body(15, 0xEE)
        held = asyncio.ensure_future(channel.unary_unary(V1_STATUS)(held_body, timeout=60))
        await asyncio.wait_for(fake.scripts[V1_STATUS].holding.wait(), 10)
        # While the runtime reads nothing of that call, the rest of the connection flows.
        await asyncio.wait_for(_echoes(channel, [1, 4, 2, 3, 1, 4, 2, 3], timeout=30), 45)
        assert not held.done()
        assert staged.seen == 4
        fake.scripts[V1_STATUS].release.set()
        assert await held == held_body
    assert fake.calls(V1_STATUS)[0].requests == [held_body]


@pytest.fixture
async def tiny(sock_dir) -> AsyncIterator[FakeBackend]:  # type: ignore[no-untyped-def]
    """A runtime advertising 1 KiB windows (up until the proxy in front of it has stopped)."""
    async with FakeBackend(sock_dir / "tiny.sock", options=TINY_WINDOWS) as backend:
        yield backend


async def test_a_runtime_with_tiny_windows_gets_large_messages_whole(tiny, start_proxy, sock_dir) -> None:
    tiny.script(V1_LIST, echo=True)
    tiny.script(V1_PODS, echo=True)
    staged = Staged()
    await start_proxy(tiny.socket, stages=(staged,))
    client_tiny = [*WIDE, *TINY_WINDOWS, ("grpc.http2.max_frame_size", 16384)]
    for options in (WIDE, client_tiny):  # the client's windows wide, then tiny too
        async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=options) as channel:
            await asyncio.wait_for(_echoes(channel, [1, 4, 15, 2], timeout=90), 120)
    assert staged.seen == 4


SIZES_MIB = [1, 15, 4, 9, 2, 12, 7, 3]


@pytest.mark.parametrize(
    "options",
    [
        [],
        # A peer with tiny windows and frames: no BDP growth, 16 KiB frames.
        [*TINY_WINDOWS, ("grpc.http2.max_frame_size", 16384)],
    ],
    ids=["default-windows", "tiny-windows"],
)
async def test_many_large_messages_on_relayed_and_staged_streams_of_one_connection(
    fake, start_proxy, sock_dir, options
) -> None:
    fake.script(V1_LIST, echo=True)
    fake.script(V1_PODS, echo=True)
    staged = Staged()
    await start_proxy(fake.socket, stages=(staged,))
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=[*WIDE, *options]) as channel:
        await asyncio.wait_for(_echoes(channel, SIZES_MIB + SIZES_MIB[::-1], timeout=60), 120)
    assert staged.seen == len(SIZES_MIB)


async def test_a_client_that_stops_reading_one_stream_holds_up_no_other(fake, start_proxy, sock_dir) -> None:
    """A server stream whose client does not read holds only its own window."""
    events = "/runtime.v1.RuntimeService/GetContainerEvents"
    fake.script(events, stream=[b"\x0a" + b"e" * MIB] * 8)
    fake.script(V1_LIST, echo=True)
    await start_proxy(fake.socket)
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=WIDE) as channel:
        stream = channel.unary_stream(events)(b"")
        first = await stream.read()  # then never read on: its window fills
        assert len(first) == MIB + 1
        for i in range(20):
            assert await channel.unary_unary(V1_LIST)(bytes([i]) * 100_000, timeout=10) == bytes([i]) * 100_000
        stream.cancel()


@pytest.mark.parametrize(
    "options",
    [[("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 16 * MIB)],
     [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 65535)]],
    ids=["16-mib-windows", "64-kib-windows"],  # the latter as grpc-go's (kubelet's) to start with
)
async def test_a_staged_calls_large_answer_is_not_held_for_its_stages(
    fake, start_proxy, sock_dir, monkeypatch, options
) -> None:
    """The frames path holds a staged call's answer until its stages are done, and
    they wait for all of it: an answer over the client's stream window (64 KiB
    case), or holding back half the runtime's connection window (16 MiB case),
    must go as it comes. The proxy's own limit on that hold is put out of reach
    here, so any such hold fails the call's deadline."""
    monkeypatch.setattr(downstream, "GATE_LIMIT_S", 600.0)
    fake.script(V1_PODS, echo=True)
    staged = Staged()
    await start_proxy(fake.socket, stages=(staged,))
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=[*WIDE, *options]) as channel:
        for mib in (6, 1):
            body = _body(mib, mib)
            assert await channel.unary_unary(V1_PODS)(body, timeout=20) == body
        assert await channel.unary_unary(V1_PODS)(b"small", timeout=20) == b"small"
    assert staged.seen == 3


async def test_a_small_answer_stays_held_for_its_stages_while_others_pile_up_behind_it(
    fake, start_proxy, sock_dir, monkeypatch
) -> None:
    """The early release is for answers the runtime cannot finish sending: a
    whole one stays held until its stages have recorded it, however much of
    other calls' answers waits behind it."""
    monkeypatch.setattr(downstream, "GATE_LIMIT_S", 600.0)
    fake.script(V1_PODS, response=b"\x0a\x03pod")
    fake.script(V1_LIST, echo=True)
    recording = Staged(recording_s=0.5)
    await start_proxy(fake.socket, stages=(recording,))
    options = [*WIDE, ("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 16 * MIB)]
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=options) as channel:
        hooked = asyncio.ensure_future(channel.unary_unary(V1_PODS)(b"", timeout=20))
        await asyncio.wait_for(recording.answered.wait(), 10)
        big = _body(3, 7)
        relayed = asyncio.ensure_future(channel.unary_unary(V1_LIST)(big, timeout=20))
        assert await hooked == b"\x0a\x03pod"
        assert recording.recorded, "the client had the answer before its stages recorded it"
        assert await relayed == big


async def test_an_answer_of_exactly_the_clients_stream_window_stays_held_for_its_stages(
    fake, start_proxy, sock_dir, monkeypatch
) -> None:
    """Whole at the proxy when it fills the window: only its trailers are to
    come, which cost no window, so it needs no early release."""
    monkeypatch.setattr(downstream, "GATE_LIMIT_S", 600.0)
    message = b"\x0a\xf6\xff\x03" + b"p" * (65529 - 4)  # with its 5-byte prefix: 65534 bytes of DATA
    fake.script(V1_PODS, response=message)
    recording = Staged(recording_s=0.5)
    await start_proxy(fake.socket, stages=(recording,))
    options = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 65534)]
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=options) as channel:
        assert await channel.unary_unary(V1_PODS)(b"", timeout=20) == message
    assert recording.recorded, "the client had the answer before its stages recorded it"
