"""containerd SIGKILLed twice under 16 clients running lifecycles and reads through the proxy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cri_api.hookapi.api_pb2 import ContainerResourceHookRequest, PodSandboxHookRequest
from cri_api.v1 import api_pb2_grpc as v1_grpc
from runtimeproxy.cripath.channelopts import channel_options
from runtimeproxy.hookpath import store as store_module
from runtimeproxy.host.containerd import LocalContainerd

from ..hookprocs import hook_server, registered
from ..integration.proxyfixtures import ProxyLauncher
from .workload import Ledger, listed, load, mismatches, progress

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# containerd's CRI answer to every call but Version until it has loaded its state.
CRI_STARTING = "server is not initialized yet"


async def sigkill(runtime: LocalContainerd) -> None:
    """Kill containerd as the OOM killer would; its shims and containers live on."""
    proc = runtime._proc
    assert proc is not None and proc.returncode is None
    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()


class HealthWatch:
    """The proxy's health as a client sees it, through grpc.health.v1 Watch."""

    def __init__(self, channel: aio.Channel) -> None:
        self.seen: list[int] = []
        self._changed = asyncio.Event()
        self._stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))

    async def follow(self) -> None:
        async for answer in self._stream:
            self.seen.append(answer.status)
            self._changed.set()

    async def until(self, status: int, timeout: float = 60) -> None:
        async with asyncio.timeout(timeout):
            while not self.seen or self.seen[-1] != status:
                self._changed.clear()
                await self._changed.wait()


@contextlib.asynccontextmanager
async def watching(channel: aio.Channel) -> AsyncIterator[HealthWatch]:
    watch = HealthWatch(channel)
    task = asyncio.create_task(watch.follow())
    try:
        yield watch
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_backend_sigkill_twice_under_load(
    own_containerd: LocalContainerd, pod_log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "RECHECK_DELAYS_S", (0.5, 1.0, 2.0))  # the test waits for them
    await own_containerd.start(timeout=60)
    ledger, direct_ledger = Ledger(), Ledger()
    async with contextlib.AsyncExitStack() as stack:
        launcher = ProxyLauncher(own_containerd.socket, stack)
        running, _ = await launcher.start(probe_max_interval=0.5)
        # A hook server, on a point the load never reaches: the proxy records
        # calls (and asks again of removals it did not see end) only while one
        # is registered.
        hook = await stack.enter_async_context(hook_server(launcher.dir, "kept", {"PreUpdateContainerResources": {}}))
        hook.register(launcher.hook_dir, ["PreUpdateContainerResources"])
        await registered(running, 1)
        channel = await stack.enter_async_context(launcher.channel())
        health = await stack.enter_async_context(watching(channel))
        await health.until(SERVING)
        ledger.moment = lambda: "serving" if health.seen[-1] == SERVING else "not serving"
        # Clients straight at containerd beside them show what a failed call looks like
        # without the proxy; their channel reconnects as quickly as the proxy's does.
        direct = await stack.enter_async_context(
            aio.insecure_channel(own_containerd.address, options=channel_options(16 << 20, 16 << 20)))
        async with (load(v1_grpc.RuntimeServiceStub(channel), ledger, pod_log_dir),
                    load(v1_grpc.RuntimeServiceStub(direct), direct_ledger, pod_log_dir, clients=8, name="d")):
            for _ in range(2):
                await progress(ledger, 30)
                await sigkill(own_containerd)
                await health.until(NOT_SERVING)
                await own_containerd.start(timeout=60, images=False)
                await health.until(SERVING)
            await progress(ledger, 30)

        # Every failed call failed as a direct client's did: UNAVAILABLE while the
        # runtime is away, and else what containerd itself answered: what the
        # direct clients got, its refusal of every call but Version while its CRI
        # plugin loads its state after a start (the window the proxy reports
        # NOT_SERVING for: its probe waits for Status, which that refusal holds
        # back too; direct clients reconnecting a moment later miss it), or, for
        # a call the kill caught half-way in containerd, an error containerd logged.
        containerd_log = own_containerd.log_path.read_text(errors="replace")

        def explained(status: str) -> bool:
            details = status.split(": ", 1)[-1]
            if details == CRI_STARTING:  # only before the proxy reported SERVING again
                return ledger.moments[status] == {"not serving"}
            return status in direct_ledger.errors() or details[:60] in containerd_log

        unexplained = {status for status in ledger.errors() if not explained(status)}
        assert unexplained == set(), (ledger.moments, ledger.failures)
        assert health.seen == [SERVING, NOT_SERVING, SERVING, NOT_SERVING, SERVING]
        runtime = await listed(v1_grpc.RuntimeServiceStub(direct))
        assert mismatches(ledger.merged(direct_ledger), runtime) == []
        # Of what went through it, the proxy remembers nothing the runtime does
        # not have: removals whose answer it never saw (the client left, the
        # runtime died) are asked again, and the rebuild after a restart drops
        # what the runtime no longer lists.
        await running.hooks.rechecked()
        store = running.store

        def through_proxy(records: Mapping[str, PodSandboxHookRequest | ContainerResourceHookRequest]) -> set[str]:
            return {object_id for object_id, record in records.items() if record.pod_meta.uid in ledger.pods}

        assert through_proxy(store.pods) <= set(runtime.pods.values())
        assert through_proxy(store.containers) <= set(runtime.containers.values())
        # A rebuild also read back the direct clients' objects of the time; those
        # they removed since (past the proxy) go at the next resync.
        await store.forget_unlisted()
        assert set(store.pods) <= set(runtime.pods.values())
        assert set(store.containers) <= set(runtime.containers.values())
