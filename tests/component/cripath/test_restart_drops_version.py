"""A runtime restarted as one that no longer serves a CRI version (containerd
1.7, v1 and v1alpha2, replaced by 2.x, v1 only): until the proxy has probed
it, a call in the dropped version gets UNAVAILABLE (kubelet retries it), not
the new runtime's UNIMPLEMENTED; once probed, the call is translated and
served. A probed runtime's UNIMPLEMENTED (a method it lacks) stays
UNIMPLEMENTED. On both data paths (tests/component/grpcpath/)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio

from ..fakes import FakeBackend

A2_LIST = "/runtime.v1alpha2.RuntimeService/ListContainers"
V1_LIST = "/runtime.v1.RuntimeService/ListContainers"
V1_STATUS = "/runtime.v1.RuntimeService/Status"
V1_CHECKPOINT = "/runtime.v1.RuntimeService/CheckpointContainer"


async def code_of(socket, path: str) -> grpc.StatusCode:
    async with aio.insecure_channel(f"unix://{socket}") as channel:  # a new connection: the restarted runtime's
        try:
            await channel.unary_unary(path)(b"", timeout=5)
        except aio.AioRpcError as err:
            return err.code()
        return grpc.StatusCode.OK


async def test_a_call_in_a_version_the_restarted_runtime_dropped_is_unavailable_until_probed(
    sock_dir, start_proxy
) -> None:
    socket, proxy_socket = sock_dir / "b.sock", sock_dir / "proxy.sock"
    lost, probed = asyncio.Event(), asyncio.Event()
    async with FakeBackend(socket) as old:
        old.script(V1_CHECKPOINT, code=grpc.StatusCode.UNIMPLEMENTED, details="unknown method CheckpointContainer")
        proxy = await start_proxy(socket, serve_versions="v1,v1alpha2")  # as for a kubelet that speaks v1alpha2
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
        assert await code_of(proxy_socket, A2_LIST) == grpc.StatusCode.UNAVAILABLE
        assert await code_of(proxy_socket, V1_LIST) == grpc.StatusCode.OK  # the rest is served meanwhile
        new.scripts[V1_STATUS].release.set()
        await asyncio.wait_for(probed.wait(), 10)
        assert proxy.router.plan is not None and proxy.router.plan.routes["v1alpha2"] == "v1"  # translated now
        assert await code_of(proxy_socket, A2_LIST) == grpc.StatusCode.OK
        assert len(new.calls(V1_LIST)) == 2  # the v1 call meanwhile, and this one, translated
        new.script(V1_CHECKPOINT, code=grpc.StatusCode.UNIMPLEMENTED, details="unknown method CheckpointContainer")
        assert await code_of(proxy_socket, V1_CHECKPOINT) == grpc.StatusCode.UNIMPLEMENTED
