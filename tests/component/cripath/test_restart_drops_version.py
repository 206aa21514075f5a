"""A runtime restarted as one that no longer serves a CRI version (containerd
1.7, v1 and v1alpha2, replaced by 2.x, v1 only): once the proxy has probed
it, a call in the dropped version is translated and served; until then, the
grpc data path answers the new runtime's UNIMPLEMENTED as UNAVAILABLE
(kubelet retries it), while the frames data path relays the call verbatim on
its connection's own runtime connection, as every call in a version the
runtime was probed serving, and it gets the runtime's own answer (the relay
passes the runtime's trailers as they are coded). A probed runtime's
UNIMPLEMENTED (a method it lacks) stays UNIMPLEMENTED, and costs no probe;
one from a runtime not probed again brings its re-probe forward. On both data
paths (tests/component/grpcpath/)."""

from __future__ import annotations

import asyncio

import grpc
from grpc import aio

from runtimeproxy.cripath import backend as backend_module

from ..fakes import FakeBackend, is_probe

A2_LIST = "/runtime.v1alpha2.RuntimeService/ListContainers"
V1_LIST = "/runtime.v1.RuntimeService/ListContainers"
V1_STATUS = "/runtime.v1.RuntimeService/Status"
V1_CHECKPOINT = "/runtime.v1.RuntimeService/CheckpointContainer"


async def status_of(socket, path: str) -> tuple[grpc.StatusCode, str]:
    async with aio.insecure_channel(f"unix://{socket}") as channel:  # a new connection: the restarted runtime's
        try:
            await channel.unary_unary(path)(b"", timeout=5)
        except aio.AioRpcError as err:
            return err.code(), err.details() or ""
        return grpc.StatusCode.OK, ""


async def code_of(socket, path: str) -> grpc.StatusCode:
    return (await status_of(socket, path))[0]


async def test_a_call_in_a_version_the_restarted_runtime_dropped_before_and_after_its_re_probe(
    sock_dir, start_proxy
) -> None:
    socket, proxy_socket = sock_dir / "b.sock", sock_dir / "proxy.sock"
    lost, probed = asyncio.Event(), asyncio.Event()
    async with FakeBackend(socket) as old:
        old.script(V1_CHECKPOINT, code=grpc.StatusCode.UNIMPLEMENTED, details="unknown method CheckpointContainer")
        proxy = await start_proxy(socket, serve_versions="v1,v1alpha2")  # as for a kubelet that speaks v1alpha2
        serving = "frames" if proxy._frames is not None else "grpc"  # noqa: SLF001 - the path chosen, not the one configured
        assert proxy.router.plan is not None and proxy.router.plan.routes["v1alpha2"] == "v1alpha2"  # native
        assert await code_of(proxy_socket, A2_LIST) == grpc.StatusCode.OK
        # a method the probed runtime lacks: its own answer
        assert await code_of(proxy_socket, V1_CHECKPOINT) == grpc.StatusCode.UNIMPLEMENTED
        proxy.backend.on_lost(lost.set)
        proxy.backend.on_change(lambda info: probed.set())
    await asyncio.wait_for(lost.wait(), 10)
    async with FakeBackend(socket, versions=frozenset({"v1"})) as new:
        new.script(V1_STATUS, hang=True)  # initialising: the re-probe waits
        await new.wait_calls(V1_STATUS, timeout=10)
        assert not probed.is_set()
        if serving == "grpc":
            assert await status_of(proxy_socket, A2_LIST) == (
                grpc.StatusCode.UNAVAILABLE,
                "runtime-proxy: the runtime is not probed since it was lost, and answered UNIMPLEMENTED: "
                f"unknown service {A2_LIST}",
            )
        else:  # relayed as it was routed before the restart: the runtime's own answer
            assert await status_of(proxy_socket, A2_LIST) == (grpc.StatusCode.UNIMPLEMENTED, f"unknown service {A2_LIST}")
        assert await code_of(proxy_socket, V1_LIST) == grpc.StatusCode.OK  # the rest is served meanwhile
        new.scripts[V1_STATUS].release.set()
        await asyncio.wait_for(probed.wait(), 10)
        assert proxy.router.plan is not None and proxy.router.plan.routes["v1alpha2"] == "v1"  # translated now
        assert await code_of(proxy_socket, A2_LIST) == grpc.StatusCode.OK
        assert len(new.calls(V1_LIST)) == 2  # the v1 call meanwhile, and this one, translated
        new.script(V1_CHECKPOINT, code=grpc.StatusCode.UNIMPLEMENTED, details="unknown method CheckpointContainer")
        assert await code_of(proxy_socket, V1_CHECKPOINT) == grpc.StatusCode.UNIMPLEMENTED


async def test_a_call_the_restarted_runtime_answers_unimplemented_brings_its_re_probe_forward(
    sock_dir, start_proxy, monkeypatch
) -> None:
    """The restarted runtime answered a probe but was not initialised yet
    (containerd's Status `server is not initialized yet`): the next probe
    waits its backoff (here made a minute long), unless a call in the
    dropped version gets UNIMPLEMENTED meanwhile: then it goes at once
    (PROBE_SOON_S after the last). Before: the call's answer changed nothing,
    and calls in the dropped version failed until the backoff was over (up to
    5 s in a real restart)."""
    monkeypatch.setattr(backend_module, "wait_exponential", lambda **_: lambda state: 60.0)
    socket, proxy_socket = sock_dir / "b.sock", sock_dir / "proxy.sock"
    lost, probed = asyncio.Event(), asyncio.Event()
    async with FakeBackend(socket):
        proxy = await start_proxy(socket, serve_versions="v1,v1alpha2")
        proxy.backend.on_lost(lost.set)
        proxy.backend.on_change(lambda info: probed.set())
    await asyncio.wait_for(lost.wait(), 10)
    async with FakeBackend(socket, versions=frozenset({"v1"})) as new:
        new.script(V1_STATUS, code=grpc.StatusCode.UNKNOWN, details="server is not initialized yet")
        await new.wait_calls(V1_STATUS, timeout=10)  # the re-probe failed: the next waits a minute
        new.script(V1_STATUS)  # initialised
        code = await code_of(proxy_socket, A2_LIST)
        assert code in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE)  # (frames; grpc)
        await asyncio.wait_for(probed.wait(), 10)
        assert proxy.router.plan is not None and proxy.router.plan.routes["v1alpha2"] == "v1"
        assert await code_of(proxy_socket, A2_LIST) == grpc.StatusCode.OK  # translated


async def test_a_probed_runtimes_unimplemented_brings_no_probe(sock_dir, start_proxy) -> None:
    """A method the runtime lacks (kubelet calls some a runtime may not have)
    costs no probe: only a runtime lost and not probed again is probed sooner."""
    socket, proxy_socket = sock_dir / "b.sock", sock_dir / "proxy.sock"
    async with FakeBackend(socket) as fake:
        fake.script(V1_CHECKPOINT, code=grpc.StatusCode.UNIMPLEMENTED, details="unknown method CheckpointContainer")
        await start_proxy(socket)
        probes = len([r for r in fake.received if is_probe(r.path)])
        for _ in range(5):
            assert await code_of(proxy_socket, V1_CHECKPOINT) == grpc.StatusCode.UNIMPLEMENTED
        assert await code_of(proxy_socket, V1_LIST) == grpc.StatusCode.OK  # (after them: they were all handled)
        assert len([r for r in fake.received if is_probe(r.path)]) == probes
