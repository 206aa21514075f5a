"""A listing, and a move, go to one runtime endpoint from start to end.

A reload that changes runtimeEndpoint between a listing's ListPodSandbox and
its ListContainers must not pair the old runtime's pods with the new one's
containers; nor a move carry the resources read from the old runtime's spec
to the new one; nor a listing of the old runtime be applied once the new one
is configured. Two fake runtimes, both with a sandbox "s1", on two sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from hooks.balloons import sync
from hooks.balloons.config import PodContext, parse_config
from hooks.balloons.balloon import ContainerKey
from hooks.balloons.runtime import FoundContainer, Listing, RuntimeClient
from hooks.criclient import ClientClosed, EndpointChanged
from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import Topology

from .test_retarget import _retarget, serving
from .test_server import CONFIG, FakeRuntime


class OnePodRuntime(v1_grpc.RuntimeServiceServicer):
    """Sandbox "s1" of pod ``pod_uid`` with one container; its spec runs it on
    every CPU with a memory limit of ``memory`` bytes. Records the updates."""

    def __init__(self, pod_uid: str, name: str, cid: str, memory: int) -> None:
        self.pod_uid, self.name, self.cid, self.memory = pod_uid, name, cid, memory
        self.state = v1.CONTAINER_RUNNING
        self.listed_containers = 0
        self.updates: list[v1.UpdateContainerResourcesRequest] = []

    async def ListPodSandbox(self, request: v1.ListPodSandboxRequest, context: Any) -> v1.ListPodSandboxResponse:
        meta = v1.PodSandboxMetadata(name=f"pod-{self.pod_uid}", uid=self.pod_uid, namespace="apps")
        return v1.ListPodSandboxResponse(items=[v1.PodSandbox(id="s1", metadata=meta, state=v1.SANDBOX_READY)])

    async def ListContainers(self, request: v1.ListContainersRequest, context: Any) -> v1.ListContainersResponse:
        self.listed_containers += 1
        container = v1.Container(id=self.cid, pod_sandbox_id="s1", metadata=v1.ContainerMetadata(name=self.name), state=self.state)
        return v1.ListContainersResponse(containers=[container])

    async def ContainerStatus(self, request: v1.ContainerStatusRequest, context: Any) -> v1.ContainerStatusResponse:
        spec = {"linux": {"resources": {"cpu": {"cpus": "0-7", "shares": 1024}, "memory": {"limit": self.memory}}}}
        return v1.ContainerStatusResponse(
            status=v1.ContainerStatus(id=request.container_id), info={"info": json.dumps({"runtimeSpec": spec})}
        )

    async def UpdateContainerResources(
        self, request: v1.UpdateContainerResourcesRequest, context: Any
    ) -> v1.UpdateContainerResourcesResponse:
        self.updates.append(request)
        return v1.UpdateContainerResourcesResponse()


class AfterAnswer:
    """Patched into every stub: once armed, the next answer to ``method`` (on
    any endpoint) is followed by the armed action before its caller goes on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
        self.action: Callable[[], Awaitable[None]] | None = None
        real_init = v1_grpc.RuntimeServiceStub.__init__
        after = self

        def init(stub: v1_grpc.RuntimeServiceStub, channel: Any) -> None:
            real_init(stub, channel)
            call = getattr(stub, method)

            async def then(*args: Any, **kwargs: Any) -> Any:
                response = await call(*args, **kwargs)
                action, after.action = after.action, None
                if action is not None:
                    await action()
                return response

            setattr(stub, method, then)

        monkeypatch.setattr(v1_grpc.RuntimeServiceStub, "__init__", init)


@contextlib.asynccontextmanager
async def hook_on(tmp_path: Path, old: OnePodRuntime, new: OnePodRuntime) -> AsyncIterator[BalloonsHook]:
    """The hook, rebuilt from ``old`` (on old.sock); a reload can name ``new`` (new.sock)."""
    old_sock, new_sock = tmp_path / "old.sock", tmp_path / "new.sock"
    async with serving(old, old_sock), serving(new, new_sock):  # type: ignore[arg-type]
        config = parse_config({**CONFIG, "runtimeEndpoint": str(old_sock)})
        hook = BalloonsHook(str(tmp_path / "b.sock"), config, topology=Topology.synthetic(1, 1, 8, 1),
                            runtime=RuntimeClient(str(old_sock)), reconcile_interval=3600)
        try:
            await hook.rebuild()
            yield hook
        finally:
            await hook.stop(0)


def members(hook: BalloonsHook) -> dict[ContainerKey, str]:
    return {m.key: m.container_id for _, m in hook.state.pool.members()}


async def reconcile_retargeted(after: AfterAnswer, tmp_path: Path, hook: BalloonsHook) -> None:
    """A reconcile pass during which ``after``'s call is answered, then a
    reload names new.sock: the pass is abandoned."""
    after.action = lambda: _retarget(tmp_path, hook)
    with pytest.raises(EndpointChanged):
        await hook.reconcile()


async def test_a_reload_between_the_listings_two_calls_pairs_no_pod_with_another_runtimes_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    after_pods = AfterAnswer(monkeypatch, "ListPodSandbox")
    old, new = OnePodRuntime("old-pod", "old-ctr", "c-old", 111), OnePodRuntime("new-pod", "new-ctr", "c-new", 222)
    async with hook_on(tmp_path, old, new) as hook:
        assert members(hook) == {("old-pod", "old-ctr"): "c-old"}
        await reconcile_retargeted(after_pods, tmp_path, hook)  # old's pods answered, then new.sock
        # Not new's container c-new taken for a container of old's pod.
        assert members(hook) == {("old-pod", "old-ctr"): "c-old"}
        assert new.listed_containers == 0
        await hook.reconcile()  # the next pass: new's pods and containers
        assert members(hook) == {("old-pod", "old-ctr"): "c-old", ("new-pod", "new-ctr"): "c-new"}


async def test_a_listing_of_the_old_endpoint_is_not_applied_after_a_reload_changed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    after_containers = AfterAnswer(monkeypatch, "ListContainers")
    old, new = OnePodRuntime("p", "app", "c1", 111), OnePodRuntime("p", "app", "c1", 222)
    async with hook_on(tmp_path, old, new) as hook:
        old.state = v1.CONTAINER_EXITED  # old shows c1 exited (no spec read: the listing is done), new runs it
        await reconcile_retargeted(after_containers, tmp_path, hook)
        assert members(hook) == {("p", "app"): "c1"}  # not released for the old runtime's exit
        await hook.reconcile()
        assert members(hook) == {("p", "app"): "c1"}


async def test_a_move_reads_the_spec_from_the_endpoint_it_updates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    after_status = AfterAnswer(monkeypatch, "ContainerStatus")
    old, new = OnePodRuntime("p", "app", "c1", 111), OnePodRuntime("p", "app", "c1", 222)
    async with hook_on(tmp_path, old, new) as hook:  # c1 ran on every CPU: placed anew, to be moved
        after_status.action = lambda: _retarget(tmp_path, hook)  # old's spec read, then new.sock
        first_pass = await hook.apply_moves()
        assert await hook.apply_moves()
        assert old.updates == []
        assert [(u.container_id, u.linux.cpuset_cpus, u.linux.memory_limit_in_bytes) for u in new.updates] == [("c1", "1", 222)]
        assert not first_pass  # its move was not sent: still due, sent by the next pass


async def test_a_hook_stopped_during_the_start_up_listing_ends_its_rebuild_and_opens_no_channel_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken for a retarget, the closed channel was listed again at once on a
    new channel opened after close(), never closed."""
    after_pods = AfterAnswer(monkeypatch, "ListPodSandbox")
    runtime, sock = OnePodRuntime("p", "app", "c1", 111), tmp_path / "old.sock"
    async with serving(runtime, sock):  # type: ignore[arg-type]
        hook = BalloonsHook(str(tmp_path / "b.sock"), parse_config({**CONFIG, "runtimeEndpoint": str(sock)}),
                            topology=Topology.synthetic(1, 1, 8, 1), runtime=RuntimeClient(str(sock)),
                            reconcile_interval=3600)
        after_pods.action = lambda: hook.stop(0)  # the pods answered, then the hook stops
        async with asyncio.timeout(5):  # bounds a loop that goes on
            await hook._rebuild_then_reconcile()  # ends: the hook is stopping
        assert (runtime.listed_containers, hook._ready.is_set()) == (0, False)
        assert hook._runtime._connection is None  # type: ignore[attr-defined]


async def test_a_closed_client_ends_the_moves_and_sends_none(tmp_path: Path) -> None:
    old, new = OnePodRuntime("p", "app", "c1", 111), OnePodRuntime("p", "app", "c1", 222)
    async with hook_on(tmp_path, old, new) as hook:  # c1 ran on every CPU: placed anew, to be moved
        await hook._runtime.close()  # type: ignore[attr-defined]  # as the hook's stop() does
        hook._moves_due.set()
        async with asyncio.timeout(5):
            await hook._move_containers()  # ends rather than retrying
        assert old.updates == [] and hook._runtime._connection is None  # type: ignore[attr-defined]


async def test_a_reload_after_the_client_closed_opens_no_channel(tmp_path: Path) -> None:
    """A config change seen while the hook stops: retarget() after close()
    keeps the client closed (a channel opened now would never be closed)."""
    old, new = OnePodRuntime("p", "app", "c1", 111), OnePodRuntime("p", "app", "c1", 222)
    async with hook_on(tmp_path, old, new) as hook:
        await hook._runtime.close()  # type: ignore[attr-defined]  # as the hook's stop() does
        await _retarget(tmp_path, hook)
        with pytest.raises(ClientClosed):
            await hook.reconcile()
        with pytest.raises(ClientClosed):
            await hook.apply_moves()  # c1 ran on every CPU: a move is due
        assert hook._runtime._connection is None  # type: ignore[attr-defined]
        assert (new.listed_containers, new.updates) == (0, [])


async def test_a_closed_client_ends_the_reconciles(tmp_path: Path) -> None:
    old, new = OnePodRuntime("p", "app", "c1", 111), OnePodRuntime("p", "app", "c1", 222)
    async with hook_on(tmp_path, old, new) as hook:  # rebuilt: the reconcile loop comes next
        hook._reconcile_interval = 0
        listed = old.listed_containers
        await hook._runtime.close()  # type: ignore[attr-defined]
        async with asyncio.timeout(5):
            await hook._rebuild_then_reconcile()  # ends, neither raising nor listing again
        assert old.listed_containers == listed and hook._runtime._connection is None  # type: ignore[attr-defined]


class ListedOnce(FakeRuntime):
    """Runs pod p's container c1 on CPU 1; ``during_listing`` runs (once)
    while the start-up listing is under way."""

    def __init__(self) -> None:
        super().__init__()
        self.live = [FoundContainer("c1", ("p", "app"), PodContext("apps", "pod-p", "app", {}, {}), "p", frozenset({1}), "0", 1024)]
        self.during_listing: Callable[[], Awaitable[None]] | None = None

    async def list_containers(self) -> Listing:
        found = await super().list_containers()
        action, self.during_listing = self.during_listing, None
        if action is not None:
            await action()
        return found


async def test_a_start_up_listing_of_the_old_endpoint_is_not_rebuilt_from_after_a_reload_changed_it(tmp_path: Path) -> None:
    runtime = ListedOnce()
    hook = BalloonsHook(str(tmp_path / "b.sock"), parse_config(CONFIG), topology=Topology.synthetic(1, 1, 8, 1), runtime=runtime)
    runtime.during_listing = lambda: _retarget(tmp_path, hook)
    with pytest.raises(EndpointChanged, match="new.sock"):
        await hook.rebuild()
    assert (members(hook), hook._ready.is_set()) == ({}, False)
    await hook.rebuild()  # again, from the new endpoint
    assert (members(hook), hook._ready.is_set()) == ({("p", "app"): "c1"}, True)


async def test_the_start_up_rebuild_is_taken_again_at_once_after_an_endpoint_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sync, "RETRY_DELAY", 3600)  # not after the delay of a failure

    async def retargeted() -> None:
        raise EndpointChanged("runtimeEndpoint changed from /old to /new")

    runtime = ListedOnce()
    runtime.during_listing = retargeted
    hook = BalloonsHook(str(tmp_path / "b.sock"), parse_config(CONFIG), topology=Topology.synthetic(1, 1, 8, 1),
                        runtime=runtime, reconcile_interval=3600)
    loop = asyncio.create_task(hook._rebuild_then_reconcile())
    try:
        with caplog.at_level(logging.INFO, logger="hooks.balloons"):
            async with asyncio.timeout(5):  # bounds a loop that ended, or waits RETRY_DELAY
                await hook._ready.wait()
    finally:
        loop.cancel()
        await asyncio.wait({loop})
    assert members(hook) == {("p", "app"): "c1"}
    assert "rebuilding the assignments again: runtimeEndpoint changed from /old to /new" in caplog.text
