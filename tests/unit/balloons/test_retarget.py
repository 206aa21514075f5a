"""A reload that changes runtimeEndpoint while a runtime call is in flight.

The hook closes its channel to the old endpoint; grpc ends the calls on it
with asyncio.CancelledError (a call cancelled on this side), which must not
end the reconcile or move loop. The hook's own shutdown still ends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from hooks.balloons import sync
from hooks.balloons.config import parse_config
from hooks.balloons.runtime import RuntimeClient
from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import Topology
from runtimeproxy.host.unixsocket import grpc_address

from .test_server import CONFIG, request


class HoldingRuntime(v1_grpc.RuntimeServiceServicer):
    """A CRI runtime with no containers that holds the ``hold``-th call of
    ``method`` (1-based) unanswered; ``calls`` counts each method's calls and
    ``seen`` is set at every call."""

    def __init__(self, method: str, hold: int) -> None:
        self.method = method
        self.hold = hold
        self.calls: dict[str, int] = {}
        self.seen = asyncio.Event()
        self.holding = asyncio.Event()

    async def _call(self, method: str) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        self.seen.set()
        if method == self.method and self.calls[method] == self.hold:
            self.holding.set()
            await asyncio.Event().wait()  # until the client goes

    async def wait_calls(self, method: str, count: int) -> None:
        while self.calls.get(method, 0) < count:
            self.seen.clear()
            await self.seen.wait()

    async def ListPodSandbox(self, request: v1.ListPodSandboxRequest, context: Any) -> v1.ListPodSandboxResponse:
        await self._call("ListPodSandbox")
        return v1.ListPodSandboxResponse()

    async def ListContainers(self, request: v1.ListContainersRequest, context: Any) -> v1.ListContainersResponse:
        await self._call("ListContainers")
        return v1.ListContainersResponse()

    async def ContainerStatus(self, request: v1.ContainerStatusRequest, context: Any) -> v1.ContainerStatusResponse:
        await self._call("ContainerStatus")
        return v1.ContainerStatusResponse(status=v1.ContainerStatus(id=request.container_id))

    async def UpdateContainerResources(
        self, request: v1.UpdateContainerResourcesRequest, context: Any
    ) -> v1.UpdateContainerResourcesResponse:
        await self._call("UpdateContainerResources")
        return v1.UpdateContainerResourcesResponse()


@contextlib.asynccontextmanager
async def serving(runtime: HoldingRuntime, *sockets: Path) -> AsyncIterator[None]:
    """``runtime`` on each of ``sockets`` (an endpoint and the one a reload names)."""
    server = aio.server()
    v1_grpc.add_RuntimeServiceServicer_to_server(runtime, server)
    for socket in sockets:
        server.add_insecure_port(grpc_address(socket))
    await server.start()
    try:
        yield
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def hook_running(
    tmp_path: Path, runtime: HoldingRuntime, reconcile_interval: float = 0
) -> AsyncIterator[tuple[BalloonsHook, asyncio.Task[None]]]:
    """The hook on ``old.sock`` (served with ``new.sock``), its background work
    running (by default reconciling again as soon as a pass is done)."""
    old, new = tmp_path / "old.sock", tmp_path / "new.sock"
    async with serving(runtime, old, new):
        config = parse_config({**CONFIG, "runtimeEndpoint": str(old)})
        hook = BalloonsHook(str(tmp_path / "b.sock"), config, topology=Topology.synthetic(1, 1, 8, 1),
                            runtime=RuntimeClient(str(old)), reconcile_interval=reconcile_interval)
        background = asyncio.create_task(hook.background())
        try:
            yield hook, background
        finally:
            background.cancel()
            await asyncio.wait({background}, timeout=5)  # bounded: a loop that swallows it fails the test, not hangs
            await hook.stop(0)


async def _retarget(tmp_path: Path, hook: BalloonsHook) -> None:
    path = tmp_path / "balloons.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "runtimeEndpoint": str(tmp_path / "new.sock")}))
    assert await hook.reload(path)


async def test_a_reload_that_changes_the_runtime_endpoint_during_a_reconcile_does_not_end_the_reconciles(tmp_path) -> None:
    runtime = HoldingRuntime("ListPodSandbox", hold=2)  # the rebuild's goes, the first reconcile's is held
    async with hook_running(tmp_path, runtime) as (hook, background):
        async with asyncio.timeout(10):
            await runtime.holding.wait()
            await _retarget(tmp_path, hook)  # the held call is cancelled
            await runtime.wait_calls("ListPodSandbox", 3)  # reconciles go on, on the new endpoint
        assert not background.done()


async def test_a_reload_that_changes_the_runtime_endpoint_during_a_move_does_not_end_the_moves(tmp_path) -> None:
    runtime = HoldingRuntime("UpdateContainerResources", hold=1)
    async with hook_running(tmp_path, runtime, reconcile_interval=3600) as (hook, background):
        async with asyncio.timeout(10):
            await hook.pre_start_container(request("a", "app", shares=1024, cid="c-a"))  # to be moved to its balloon
            await runtime.holding.wait()
            await _retarget(tmp_path, hook)
            await runtime.wait_calls("UpdateContainerResources", 2)  # moved again, through the new endpoint
        assert not background.done()


@pytest.mark.parametrize("channel_closed_first", [False, True])
async def test_the_hooks_shutdown_still_ends_its_loops_during_a_runtime_call(tmp_path, channel_closed_first: bool) -> None:
    """``hook run`` stops the server (closing the runtime channel) before it
    cancels the background work: neither must leave a loop running."""
    runtime = HoldingRuntime("ListPodSandbox", hold=2)
    async with hook_running(tmp_path, runtime) as (hook, background):
        async with asyncio.timeout(10):
            await runtime.holding.wait()
            if channel_closed_first:
                await hook.stop(0)
        background.cancel()
        await asyncio.wait({background}, timeout=5)
        assert background.cancelled()


async def test_a_reload_between_the_listings_two_calls_does_not_end_the_reconciles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both tasks ready in one loop turn: the retarget's close lands after
    # ListPodSandbox answered, before ListContainers goes (a gate orders them).
    runtime = HoldingRuntime("none", hold=0)
    gate, answered = asyncio.Event(), asyncio.Event()
    real_init = v1_grpc.RuntimeServiceStub.__init__
    listings = 0

    def held_after_the_pods(stub: v1_grpc.RuntimeServiceStub, channel: aio.Channel) -> None:
        real_init(stub, channel)
        list_pods = stub.ListPodSandbox

        async def held(*args: Any, **kwargs: Any) -> v1.ListPodSandboxResponse:
            nonlocal listings
            response = await list_pods(*args, **kwargs)
            listings += 1
            if listings == 2:  # the first reconcile's (the rebuild's went)
                answered.set()
                await gate.wait()
            return response

        stub.ListPodSandbox = held

    monkeypatch.setattr(v1_grpc.RuntimeServiceStub, "__init__", held_after_the_pods)
    async with hook_running(tmp_path, runtime) as (hook, background):
        async with asyncio.timeout(10):
            await answered.wait()
            await _retarget(tmp_path, hook)  # closes the channel of the listing under way
            gate.set()
            await runtime.wait_calls("ListPodSandbox", 3)  # the reconciles go on
        assert not background.done()


@pytest.mark.parametrize("held", ["rebuild", "reconcile", "move"])
async def test_a_runtime_call_the_hooks_stop_cancels_is_not_warned_of(tmp_path, caplog, monkeypatch, held: str) -> None:
    """stop() closes the runtime channel, cancelling the call under way: the
    loop ends quietly, without 'cannot rebuild assignments ... retrying in 5s',
    'reconcile ... cancelled' or 'cannot move container ... cancelled'."""
    monkeypatch.setattr(sync, "RETRY_DELAY", 0)  # (a loop that retries does so at once)
    method, hold = {"rebuild": ("ListPodSandbox", 1), "reconcile": ("ListPodSandbox", 2),
                    "move": ("UpdateContainerResources", 1)}[held]
    runtime, sock = HoldingRuntime(method, hold), tmp_path / "old.sock"
    async with serving(runtime, sock):
        hook = BalloonsHook(str(tmp_path / "b.sock"), parse_config({**CONFIG, "runtimeEndpoint": str(sock)}),
                            topology=Topology.synthetic(1, 1, 8, 1), runtime=RuntimeClient(str(sock)), reconcile_interval=0)
        if held == "move":
            await hook.rebuild()
            await hook.pre_start_container(request("a", "app", shares=1024, cid="c-a"))  # to be moved to its balloon
            task = asyncio.create_task(hook._move_containers())
        else:
            task = asyncio.create_task(hook._rebuild_then_reconcile())
        with caplog.at_level(logging.WARNING, logger="hooks.balloons"):
            async with asyncio.timeout(10):
                await runtime.holding.wait()
                await hook.stop(0)
                await task  # ends: the hook is stopping
    warned = [r.getMessage() for r in caplog.records if r.name.startswith("hooks.balloons") and r.levelno >= logging.WARNING]
    assert warned == []
