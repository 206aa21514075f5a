"""Flow control against the runtime's side of the proxy, on both data paths
(tests/component/grpcpath/): a runtime that stops reading one call's large
request holds up no other call on the client's connection, relayed or
staged; a runtime advertising tiny windows gets large messages whole, in
frames and windows it accepts (grpc core answers anything else with a
connection error, which would fail every call under way)."""

from __future__ import annotations

import asyncio

from grpc import aio

from runtimeproxy.cripath.stage import StageProvider

from ..fakes import FakeBackend

V1_LIST = "/runtime.v1.RuntimeService/ListContainers"
V1_PODS = "/runtime.v1.RuntimeService/ListPodSandbox"
V1_STATUS = "/runtime.v1.RuntimeService/ContainerStatus"
MIB = 1024 * 1024
WIDE = [("grpc.max_receive_message_length", 64 * MIB), ("grpc.max_send_message_length", 64 * MIB)]
# What grpc core advertises with these: 1 KiB stream windows that never grow.
TINY_WINDOWS = (("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024))


class Staged(StageProvider):
    """A stage with work on every ListPodSandbox: those calls take the proxy's own path."""

    def __init__(self) -> None:
        self.seen = 0

    def stage_for(self, method, client_version, backend_version):  # type: ignore[no-untyped-def]
        if method != "ListPodSandbox":
            return None

        async def stage(request, context, send):  # type: ignore[no-untyped-def]
            self.seen += 1
            return await send(request)

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


async def test_a_runtime_with_tiny_windows_gets_large_messages_whole(sock_dir, start_proxy) -> None:
    async with FakeBackend(sock_dir / "tiny.sock", options=TINY_WINDOWS) as tiny:
        tiny.script(V1_LIST, echo=True)
        tiny.script(V1_PODS, echo=True)
        staged = Staged()
        await start_proxy(tiny.socket, stages=(staged,))
        client_tiny = [*WIDE, *TINY_WINDOWS, ("grpc.http2.max_frame_size", 16384)]
        for options in (WIDE, client_tiny):  # the client's windows wide, then tiny too
            async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=options) as channel:
                await asyncio.wait_for(_echoes(channel, [1, 4, 15, 2], timeout=90), 120)
        assert staged.seen == 4
