"""Messages at and over the size limits, and a separate image backend, as a
client sees them: the same on both data paths (tests/component/grpcpath/).

15 MiB requests and answers arrive byte for byte (kubelet's limit is 16
MiB); an answer over the client-facing limit fails the call with
RESOURCE_EXHAUSTED as a request over it does, and a request over it never
becomes a call at the runtime. Image calls go to the image backend and back
unchanged, and while it is away only they fail.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1

from ..fakes import FakeBackend

V1_LIST = "/runtime.v1.RuntimeService/ListContainers"
LIST_IMAGES = "/runtime.v1.ImageService/ListImages"
MIB = 1024 * 1024
WIDE = [("grpc.max_receive_message_length", 64 * MIB), ("grpc.max_send_message_length", 64 * MIB)]


def _body(size: int) -> bytes:
    """``size`` bytes that are not all alike (a relay that dropped or reordered a frame shows)."""
    return bytes(range(256)) * (size // 256) + b"\x07" * (size % 256)


async def test_a_15_mib_request_and_answer_arrive_byte_for_byte(fake, start_proxy, sock_dir) -> None:
    await start_proxy(fake.socket)
    request = _body(15 * MIB)
    fake.script(V1_LIST, echo=True)
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=WIDE) as wide:
        assert await wide.unary_unary(V1_LIST)(request) == request
        assert fake.calls(V1_LIST)[-1].requests == [request]
        answer = _body(15 * MIB + 3)
        fake.script(V1_LIST, response=answer)
        assert await wide.unary_unary(V1_LIST)(b"small") == answer
        assert fake.calls(V1_LIST)[-1].requests == [b"small"]
        async with aio.insecure_channel(f"unix://{fake.socket}", options=WIDE) as direct:
            assert await direct.unary_unary(V1_LIST)(b"small") == answer  # what direct answers, too


async def test_an_answer_over_the_limit_is_resource_exhausted(fake, start_proxy, client) -> None:
    await start_proxy(fake.socket, max_recv_message_bytes=1024, max_send_message_bytes=1024)
    fake.script(V1_LIST, response=b"\x00" * 2000)
    with pytest.raises(aio.AioRpcError) as err:
        await client.unary_unary(V1_LIST)(b"")
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    fake.script(V1_LIST, response=b"\x00" * 1000)  # the connection goes on
    assert await client.unary_unary(V1_LIST)(b"") == b"\x00" * 1000


async def test_a_request_over_the_limit_never_reaches_the_runtime(fake, start_proxy, client) -> None:
    await start_proxy(fake.socket, max_recv_message_bytes=1024, max_send_message_bytes=1024)
    fake.script(V1_LIST, echo=True)
    with pytest.raises(aio.AioRpcError) as err:
        await client.unary_unary(V1_LIST)(b"\x01" * 2000)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await client.unary_unary(V1_LIST)(b"\x02" * 1000) == b"\x02" * 1000
    assert [call.requests for call in fake.calls(V1_LIST)] == [[b"\x02" * 1000]]


async def test_with_a_smaller_send_limit_a_message_must_fit_both(fake, start_proxy, client) -> None:
    """Each message is received on one side and sent on the other: a request
    within the receive limit but over the send limit never reaches the runtime,
    and an answer so is RESOURCE_EXHAUSTED, on both data paths alike."""
    await start_proxy(fake.socket, max_recv_message_bytes=4096, max_send_message_bytes=1024)
    fake.script(V1_LIST, echo=True)
    with pytest.raises(aio.AioRpcError) as err:
        await client.unary_unary(V1_LIST)(b"\x01" * 2000)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert fake.calls(V1_LIST) == []
    assert await client.unary_unary(V1_LIST)(b"\x02" * 1000) == b"\x02" * 1000
    fake.script(V1_LIST, response=b"\x00" * 2000)
    with pytest.raises(aio.AioRpcError) as err:
        await client.unary_unary(V1_LIST)(b"")
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_image_calls_reach_the_image_backend_unchanged(fake, start_proxy, client, sock_dir) -> None:
    reply = v1.ListImagesResponse(images=[v1.Image(id="sha256:1", size=7)]).SerializeToString() + b"\xba\x3e\x01z"
    request = v1.ListImagesRequest(filter=v1.ImageFilter(image=v1.ImageSpec(image="busybox"))).SerializeToString()
    async with FakeBackend(sock_dir / "images.sock") as images:
        images.script(LIST_IMAGES, response=reply)
        images.script("/runtime.v1.ImageService/ImageStatus", code=grpc.StatusCode.NOT_FOUND, details="no such image")
        await start_proxy(fake.socket, image_backend=images.socket)
        assert await client.unary_unary(LIST_IMAGES)(request) == reply
        assert images.calls(LIST_IMAGES)[0].requests == [request]
        with pytest.raises(aio.AioRpcError) as err:
            await client.unary_unary("/runtime.v1.ImageService/ImageStatus")(b"")
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.NOT_FOUND, "no such image")
    assert fake.calls(LIST_IMAGES) == []


async def test_while_the_image_backend_is_away_only_image_calls_fail(fake, start_proxy, client, sock_dir) -> None:
    fake.script(V1_LIST, echo=True)
    images = FakeBackend(sock_dir / "images.sock")
    await images.start()
    proxy = await start_proxy(fake.socket, image_backend=images.socket)
    assert await client.unary_unary(LIST_IMAGES)(b"") == b""
    await images.stop()
    with pytest.raises(aio.AioRpcError) as err:
        await client.unary_unary(LIST_IMAGES)(b"", timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await client.unary_unary(V1_LIST)(b"runtime") == b"runtime"
    async with FakeBackend(sock_dir / "images.sock") as again:
        again.script(LIST_IMAGES, response=b"\x0a\x00")
        # Back: once the proxy's channel to it has reconnected (its backoff is
        # at most 2 s), image calls are served again.
        await _connected(proxy.backend.image_channel)
        assert await client.unary_unary(LIST_IMAGES)(b"", timeout=5) == b"\x0a\x00"


async def _connected(channel: aio.Channel, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while (state := channel.get_state(try_to_connect=True)) != grpc.ChannelConnectivity.READY:
            await channel.wait_for_state_change(state)
