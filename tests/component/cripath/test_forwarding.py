"""Issue 2: the proxy behaves like the runtime behind it, byte for byte."""

from __future__ import annotations

import asyncio
import stat

import grpc
import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.cripath.registered import NO_SUCH_METHOD

from ..fakes import FakeBackend, is_probe

V1_LIST = "/runtime.v1.RuntimeService/ListContainers"
V1A2_LIST = "/runtime.v1alpha2.RuntimeService/ListContainers"
EVENTS = "/runtime.v1.RuntimeService/GetContainerEvents"

# A ListContainersRequest with a filter, plus field 999 that no schema knows.
REQUEST_WITH_UNKNOWN = v1.ListContainersRequest(filter=v1.ContainerFilter(id="abc")).SerializeToString() + bytes(
    [0xBA, 0x3E, 0x03]
) + b"xyz"


def unary(channel: aio.Channel, path: str) -> aio.UnaryUnaryMultiCallable:
    return channel.unary_unary(path)


@pytest.mark.parametrize(
    "versions",
    [frozenset({"v1"}), frozenset({"v1alpha2"}), frozenset({"v1", "v1alpha2"})],
    ids=["v1-only", "v1alpha2-only", "both"],
)
async def test_serves_exactly_the_backends_versions(sock_dir, start_proxy, client, versions) -> None:
    async with FakeBackend(sock_dir / "b.sock", versions=versions):
        proxy = await start_proxy(sock_dir / "b.sock")
        assert proxy.router.plan is not None
        assert set(proxy.router.plan.served) == set(versions)
        for version in ("v1", "v1alpha2"):
            call = unary(client, f"/runtime.{version}.RuntimeService/Version")(b"")
            if version in versions:
                assert v1.VersionResponse.FromString(await call).runtime_api_version == version
            else:
                with pytest.raises(aio.AioRpcError) as err:
                    await call
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
                assert f"CRI {version}" in err.value.details()


@pytest.mark.parametrize("path", [V1_LIST, V1A2_LIST, "/runtime.v1.ImageService/ListImages"])
async def test_bytes_identical_both_ways_including_unknown_fields(fake, start_proxy, client, path) -> None:
    reply = v1.ListContainersResponse(containers=[v1.Container(id="c1")]).SerializeToString() + b"\xba\x3e\x01z"
    fake.script(path, response=reply)
    await start_proxy(fake.socket)
    assert await unary(client, path)(REQUEST_WITH_UNKNOWN) == reply
    assert fake.calls(path)[0].requests == [REQUEST_WITH_UNKNOWN]


async def test_method_without_proto_travels_as_bytes(fake, start_proxy, client) -> None:
    path = "/runtime.v1.RuntimeService/SomeFutureMethod"
    fake.script(path, echo=True)
    await start_proxy(fake.socket)
    payload = bytes(range(256))
    assert await unary(client, path)(payload) == payload
    assert fake.calls(path)[0].requests == [payload]
    # ...and a server-streaming one the proxy has never heard of.
    stream_path = "/runtime.v1.RuntimeService/StreamSomethingNew"
    fake.script(stream_path, stream=[b"a", b"bb", b""])
    assert [m async for m in client.unary_stream(stream_path)(b"q")] == [b"a", b"bb", b""]


async def test_non_cri_method_is_unimplemented(fake, start_proxy, client) -> None:
    await start_proxy(fake.socket)
    with pytest.raises(aio.AioRpcError) as err:
        await unary(client, "/some.other.Service/Call")(b"")
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert fake.received == [r for r in fake.received if is_probe(r.path)]


async def test_error_status_details_and_trailers_pass_through(fake, start_proxy, client) -> None:
    trailers = (("x-why", "because"), ("grpc-status-details-bin", b"\x08\x05\x12\x04gone"))
    fake.script(V1_LIST, code=grpc.StatusCode.NOT_FOUND, details="container c1 not found", trailing=trailers)
    await start_proxy(fake.socket)
    with pytest.raises(aio.AioRpcError) as err:
        await unary(client, V1_LIST)(b"")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert err.value.details() == "container c1 not found"
    got = dict(err.value.trailing_metadata())
    assert got["x-why"] == "because"
    assert got["grpc-status-details-bin"] == b"\x08\x05\x12\x04gone"


async def test_metadata_both_ways(fake, start_proxy, client) -> None:
    fake.script(V1_LIST, initial=(("x-initial", "1"),), trailing=(("x-trailer", "2"),))
    await start_proxy(fake.socket)
    call = unary(client, V1_LIST)(b"", metadata=(("x-request-id", "r-42"), ("x-trace-bin", b"\x00\xff")))
    await call
    seen = fake.calls(V1_LIST)[0].metadata
    assert seen["x-request-id"] == "r-42"
    assert seen["x-trace-bin"] == b"\x00\xff"
    assert ("x-initial", "1") in tuple(await call.initial_metadata())
    assert ("x-trailer", "2") in tuple(await call.trailing_metadata())


@pytest.mark.parametrize("size", [64 << 10])
async def test_large_metadata_both_ways(fake, start_proxy, sock_dir, size) -> None:
    """Metadata the runtime accepts (containerd and kubelet allow 16 MiB of
    headers) passes the proxy both ways; grpc's own 8 KiB default refused it."""
    value = "v" * size
    fake.script(V1_LIST, initial=(("x-initial", value),), trailing=(("x-trailer", value),))
    await start_proxy(fake.socket)
    limits = [("grpc.max_metadata_size", 16 << 20), ("grpc.absolute_max_metadata_size", 16 << 20)]
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=limits) as kubelet_like:
        call = unary(kubelet_like, V1_LIST)(b"", metadata=(("x-request", value),))
        await call
        assert ("x-initial", value) in tuple(await call.initial_metadata())
        assert ("x-trailer", value) in tuple(await call.trailing_metadata())
    assert fake.calls(V1_LIST)[0].metadata["x-request"] == value


async def test_deadline_propagates(fake, start_proxy, client) -> None:
    await start_proxy(fake.socket)
    await unary(client, V1_LIST)(b"", timeout=7)
    remaining = fake.calls(V1_LIST)[0].time_remaining
    assert remaining is not None and 5 < remaining <= 7.1  # grpc-timeout is rounded up
    await unary(client, V1A2_LIST)(b"")
    assert fake.calls(V1A2_LIST)[0].time_remaining is None


async def test_deadline_exceeded_cancels_backend_call(fake, start_proxy, client) -> None:
    fake.script(V1_LIST, hang=True)
    await start_proxy(fake.socket)
    with pytest.raises(aio.AioRpcError) as err:
        await unary(client, V1_LIST)(b"", timeout=0.5)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(fake.cancel_seen.wait(), 5)
    assert fake.cancelled == [V1_LIST]


async def test_client_cancel_cancels_backend_call(fake, start_proxy, client) -> None:
    fake.script(V1_LIST, hang=True)
    await start_proxy(fake.socket)
    call = unary(client, V1_LIST)(b"")
    await fake.wait_calls(V1_LIST)
    call.cancel()
    await asyncio.wait_for(fake.cancel_seen.wait(), 5)
    assert fake.cancelled == [V1_LIST]


async def test_server_stream_relays_in_order(fake, start_proxy, client) -> None:
    events = [v1.ContainerEventResponse(container_id=f"c{i}").SerializeToString() for i in range(50)]
    fake.script(EVENTS, stream=events, trailing=(("x-end", "yes"),))
    await start_proxy(fake.socket)
    call = client.unary_stream(EVENTS)(b"")
    assert [m async for m in call] == events
    assert ("x-end", "yes") in tuple(await call.trailing_metadata())
    assert await call.code() == grpc.StatusCode.OK


async def test_stream_cancel_reaches_backend(fake, start_proxy, client) -> None:
    fake.script(EVENTS, stream_forever=True)
    await start_proxy(fake.socket)
    call = client.unary_stream(EVENTS)(b"")
    first = [await call.read() for _ in range(3)]
    assert first == [n.to_bytes(4, "big") for n in range(3)]
    call.cancel()
    await asyncio.wait_for(fake.cancel_seen.wait(), 5)
    assert fake.cancelled == [EVENTS]


async def test_stream_error_passes_through(fake, start_proxy, client) -> None:
    fake.script(EVENTS, code=grpc.StatusCode.UNIMPLEMENTED, details="not supported by this runtime")
    await start_proxy(fake.socket)
    with pytest.raises(aio.AioRpcError) as err:
        [m async for m in client.unary_stream(EVENTS)(b"")]
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert err.value.details() == "not supported by this runtime"


async def test_many_calls_in_flight_at_once(fake, start_proxy, client) -> None:
    """No global lock: 20 hanging calls are all at the backend together."""
    fake.script(V1_LIST, hang=True)
    await start_proxy(fake.socket)
    calls = [unary(client, V1_LIST)(b"") for _ in range(20)]
    await fake.wait_calls(V1_LIST, 20, timeout=10)
    fake.scripts[V1_LIST].hang = False  # later calls answer at once
    assert await unary(client, V1_LIST)(b"", timeout=5) == b""
    for call in calls:
        call.cancel()


async def test_message_size_limits(fake, start_proxy, client, sock_dir) -> None:
    await start_proxy(fake.socket)
    fake.script(V1_LIST, echo=True)
    big = b"\x0a" + b"\x00" * (12 * 1024 * 1024)
    async with aio.insecure_channel(
        f"unix://{sock_dir / 'proxy.sock'}",
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
    ) as wide:
        assert await wide.unary_unary(V1_LIST)(big) == big  # 12 MiB: under kubelet's 16 MiB
        with pytest.raises(aio.AioRpcError) as err:
            await wide.unary_unary(V1_LIST)(b"\x00" * (17 * 1024 * 1024))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_configurable_message_size(fake, start_proxy, client) -> None:
    await start_proxy(fake.socket, max_recv_message_bytes=1024, max_send_message_bytes=1024)
    fake.script(V1_LIST, echo=True)
    assert await unary(client, V1_LIST)(b"\x00" * 1000) == b"\x00" * 1000
    with pytest.raises(aio.AioRpcError) as err:
        await unary(client, V1_LIST)(b"\x00" * 2000)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_unavailable_until_backend_appears_then_serves(sock_dir, start_proxy, client) -> None:
    backend_sock = sock_dir / "late.sock"
    proxy = await start_proxy(backend_sock, wait=False, probe_max_interval=0.2)
    with pytest.raises(aio.AioRpcError) as err:
        await unary(client, "/runtime.v1.RuntimeService/Version")(b"")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    async with FakeBackend(backend_sock, versions=frozenset({"v1"})):
        await proxy.wait_ready(10)
        reply = await unary(client, "/runtime.v1.RuntimeService/Version")(b"")
        assert v1.VersionResponse.FromString(reply).runtime_api_version == "v1"


async def test_reprobes_after_backend_restart(sock_dir, start_proxy, client) -> None:
    """containerd replaced by one that serves other versions: noticed live."""
    backend_sock = sock_dir / "b.sock"
    first = FakeBackend(backend_sock, versions=frozenset({"v1alpha2"}))
    await first.start()
    proxy = await start_proxy(backend_sock)
    assert set(proxy.router.plan.served) == {"v1alpha2"}
    changed, lost = asyncio.Event(), asyncio.Event()
    proxy.backend.on_change(lambda info: changed.set())
    proxy.backend.on_lost(lost.set)
    await first.stop()
    async with FakeBackend(backend_sock, versions=frozenset({"v1"})):
        await asyncio.wait_for(changed.wait(), 15)

        assert set(proxy.router.plan.served) == {"v1"}
        reply = await unary(client, "/runtime.v1.RuntimeService/Version")(b"")
        assert v1.VersionResponse.FromString(reply).runtime_api_version == "v1"


async def test_backend_loss_is_noticed_and_reported_until_reprobed(sock_dir, start_proxy) -> None:
    backend_sock = sock_dir / "b.sock"
    first = FakeBackend(backend_sock, versions=frozenset({"v1"}))
    await first.start()
    proxy = await start_proxy(backend_sock)
    assert proxy.backend.connected
    lost, back = asyncio.Event(), asyncio.Event()
    proxy.backend.on_lost(lost.set)
    proxy.backend.on_change(lambda info: back.set())
    await first.stop()
    await asyncio.wait_for(lost.wait(), 15)
    assert not proxy.backend.connected
    async with FakeBackend(backend_sock, versions=frozenset({"v1"})) as second:
        await asyncio.wait_for(back.wait(), 15)
        assert proxy.backend.connected
        # Connected, but the runtime stops answering Version (its CRI plugin broke): a failed
        # probe is a loss too, even when the connection itself never failed.
        lost.clear()
        second.script("/runtime.v1.RuntimeService/Version", code=grpc.StatusCode.UNAVAILABLE, details="cri plugin down")
        reprobe = asyncio.ensure_future(proxy.backend.probe())
        await asyncio.wait_for(lost.wait(), 15)
        assert not proxy.backend.connected
        back.clear()
        del second.scripts["/runtime.v1.RuntimeService/Version"]
        await asyncio.wait_for(back.wait(), 15)
        assert proxy.backend.connected
        await reprobe


async def test_socket_mode_and_stale_socket(fake, start_proxy, sock_dir) -> None:
    import socket as _socket

    stale = sock_dir / "proxy.sock"
    s = _socket.socket(_socket.AF_UNIX)
    s.bind(str(stale))
    s.close()
    await start_proxy(fake.socket)
    mode = stale.stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o660


@pytest.mark.parametrize("data_path", ["frames", "grpc"])
async def test_the_sockets_umask_is_never_held_across_an_await(fake, start_proxy, sock_dir, monkeypatch, data_path) -> None:
    """The umask is the whole process's: what another task creates while the
    proxy starts (awaiting grpc's server start) gets the operator's umask."""
    import os

    from grpc.aio import _server

    seen: list[int] = []
    real_start = _server.Server.start

    async def start(self):  # type: ignore[no-untyped-def]
        mask = os.umask(0o022)
        os.umask(mask)
        seen.append(mask)
        await real_start(self)

    monkeypatch.setattr(_server.Server, "start", start)
    before = os.umask(0o022)
    try:
        await start_proxy(fake.socket, data_path=data_path)
    finally:
        os.umask(before)
    assert seen and set(seen) == {0o022}
    assert stat.S_IMODE((sock_dir / "proxy.sock").stat().st_mode) == 0o660


async def test_refuses_to_remove_a_non_socket(fake, sock_dir) -> None:
    from runtimeproxy.config import ProxyConfig
    from runtimeproxy.cripath.server import ListenError, Proxy

    target = sock_dir / "proxy.sock"
    target.write_text("precious")
    proxy = Proxy(ProxyConfig(listen=target, backend=fake.socket))
    with pytest.raises(ListenError, match="not a unix socket"):
        await proxy.start()
    assert target.read_text() == "precious"


async def test_shutdown_finishes_unary_ends_streams_removes_socket(fake, start_proxy, client, sock_dir) -> None:
    fake.script(V1_LIST, hang=True)
    fake.script(EVENTS, stream_forever=True)
    proxy = await start_proxy(fake.socket)
    stream = client.unary_stream(EVENTS)(b"")
    await stream.read()
    slow = asyncio.ensure_future(unary(client, V1_LIST)(b""))
    await fake.wait_calls(V1_LIST)
    stopping = asyncio.ensure_future(proxy.stop(5))
    # The stream ends at once, with a status that tells kubelet to retry.
    with pytest.raises(aio.AioRpcError) as err:
        async with asyncio.timeout(3):
            while True:
                await stream.read()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    # The in-flight unary call finishes inside the grace period.
    assert not slow.done() and not stopping.done()
    fake.scripts[V1_LIST].response = b"late but fine"
    fake.scripts[V1_LIST].release.set()
    assert await asyncio.wait_for(slow, 3) == b"late but fine"
    await asyncio.wait_for(stopping, 3)
    assert not (sock_dir / "proxy.sock").exists()


async def test_initial_metadata_passes_with_an_error(fake, start_proxy, client) -> None:
    fake.script(V1_LIST, initial=(("x-initial", "1"),), code=grpc.StatusCode.NOT_FOUND, details="gone")
    await start_proxy(fake.socket)
    call = unary(client, V1_LIST)(b"")
    with pytest.raises(aio.AioRpcError):
        await call
    assert ("x-initial", "1") in tuple(await call.initial_metadata())


async def test_refuses_a_socket_another_process_serves(fake, start_proxy, client, sock_dir) -> None:
    from runtimeproxy.config import ProxyConfig
    from runtimeproxy.cripath.server import ListenError, Proxy

    await start_proxy(fake.socket)
    second = Proxy(ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket))
    with pytest.raises(ListenError, match="in use"):
        await second.start()
    # The first one still serves on it.
    assert v1.VersionResponse.FromString(await unary(client, "/runtime.v1.RuntimeService/Version")(b"")).runtime_name == "fake"


async def test_health_follows_the_backend(sock_dir, start_proxy, client) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    backend_sock = sock_dir / "late.sock"
    proxy = await start_proxy(backend_sock, wait=False, probe_max_interval=0.2)
    health = health_pb2_grpc.HealthStub(client)
    answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
    watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=10)
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
    backend = FakeBackend(backend_sock)
    await backend.start()
    await proxy.wait_ready(10)
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
    # The runtime goes away and comes back.
    await backend.stop()
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
    async with FakeBackend(backend_sock):
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


async def test_image_service_goes_to_the_image_backend(fake, start_proxy, client, sock_dir) -> None:
    async with FakeBackend(sock_dir / "images.sock") as images:
        await start_proxy(fake.socket, image_backend=images.socket)
        await unary(client, "/runtime.v1.ImageService/ListImages")(b"")
        await unary(client, V1_LIST)(b"")
    # Besides the call, the image watch's probe (ImageFsInfo in both versions,
    # v1alpha2 first by a method that does not exist: cripath/imageprobe.py).
    calls = [r.path for r in images.received if not r.path.endswith((".ImageService/ImageFsInfo", NO_SUCH_METHOD))]
    assert calls == ["/runtime.v1.ImageService/ListImages"]
    assert fake.calls("/runtime.v1.ImageService/ListImages") == [] and len(fake.calls(V1_LIST)) == 1
