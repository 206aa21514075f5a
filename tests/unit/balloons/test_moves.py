"""Moves of running containers whose balloon changed, when the runtime fails
one, and moves after a reconcile read what the containers run on.

The hook moves a container through the proxy (runtimeEndpoint): the move's
UpdateContainerResources passes this hook's PreUpdateContainerResources
before the runtime is called, so the hook has answered the new cpuset
before it can know whether the runtime applies it.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
import yaml

from cri_api.hookapi import api_pb2
from cri_api.v1 import api_pb2 as v1
from hooks.balloons import replanning
from hooks.balloons.config import PodContext, parse_config
from hooks.balloons.runtime import FoundContainer, RuntimeClient
from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import Topology, parse_cpuset

from .test_server import CONFIG, FakeRuntime, request, started


class ProxiedRuntime(FakeRuntime):
    """A move goes through the hook's PreUpdateContainerResources (as the proxy
    sends it, with the container's spec shares), then reaches the runtime,
    which fails it while ``fail_with`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.hook: BalloonsHook | None = None
        self.pod_of: dict[str, tuple[str, str]] = {}  # container id -> (pod uid, name)

    async def pre_update(self, container_id: str) -> api_pb2.LinuxContainerResources:
        """The hook's PreUpdateContainerResources answer, which the proxy sends on."""
        assert self.hook is not None
        uid, name = self.pod_of[container_id]
        answer = await self.hook.pre_update_container_resources(request(uid, name, shares=1024, cid=container_id))
        return answer.container_resources

    async def update_cpuset(self, container_id: str, cpus: str, mems: str) -> None:
        assert (await self.pre_update(container_id)).cpuset_cpus == cpus  # the proxy would send the hook's answer
        await super().update_cpuset(container_id, cpus, mems)


async def proxied(tmp_path, runtime: ProxiedRuntime) -> BalloonsHook:
    """A started hook whose moves of container c-a (pod a's "app") go through ``runtime``."""
    hook, _ = await started(tmp_path, runtime=runtime)
    runtime.hook = hook
    runtime.pod_of = {"c-a": ("a", "app")}
    return hook


async def grow_as_balloon(hook: BalloonsHook) -> None:
    """Pod a's container c-a placed and started, then pod b placed: a's balloon grows to 1-2."""
    await hook.pre_create_container(request("a", "app", shares=1024))
    await hook.pre_start_container(request("a", "app", cid="c-a"))
    await hook.pre_create_container(request("b", "app", shares=1024))


async def test_a_move_the_runtime_failed_is_retried(tmp_path) -> None:
    runtime = ProxiedRuntime()
    hook = await proxied(tmp_path, runtime)
    await grow_as_balloon(hook)
    runtime.fail_with = grpc.StatusCode.UNKNOWN  # e.g. runc failed the update
    assert not await hook.apply_moves()
    assert runtime.updates == []  # c-a still runs on "1"
    runtime.fail_with = None
    assert await hook.apply_moves()  # the retry, RETRY_DELAY later
    assert runtime.updates == [("c-a", "1-2", "0")]
    assert await hook.apply_moves() and len(runtime.updates) == 1  # and then it is done


@pytest.mark.parametrize("code", [grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE])
async def test_a_failed_move_of_a_never_pinned_container_keeps_it_unpinned_for_a_reload(tmp_path, code) -> None:
    """First seen at its start (no answer applied): a failed move leaves it as it
    was, not pinned, so a rebuild places it anew rather than from a cpuset it never
    had; as does one that may have been applied (UNAVAILABLE: not known where it runs)."""
    runtime = ProxiedRuntime()
    hook = await proxied(tmp_path, runtime)
    await hook.pre_start_container(request("a", "app", shares=1024, cid="c-a"))
    runtime.fail_with = code
    assert not await hook.apply_moves()
    (restored,) = replanning.restored(hook.state)
    assert restored.cpus == frozenset()
    runtime.fail_with = None
    assert await hook.apply_moves() and runtime.updates == [("c-a", "1", "0")]


class AppliedButTimedOut(ProxiedRuntime):
    """The runtime applies the move, but the call ends DEADLINE_EXCEEDED (a slow
    runtime, past the hook's timeout) while ``time_out`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.time_out = False

    async def update_cpuset(self, container_id: str, cpus: str, mems: str) -> None:
        await super().update_cpuset(container_id, cpus, mems)
        if self.time_out:
            raise grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(), "deadline")


async def _timed_out_growth(tmp_path) -> tuple[BalloonsHook, AppliedButTimedOut]:
    """a's balloon grew to 1-2 for b; a's move there was applied but timed out."""
    runtime = AppliedButTimedOut()
    hook = await proxied(tmp_path, runtime)
    await grow_as_balloon(hook)
    runtime.time_out = True
    assert not await hook.apply_moves()
    assert runtime.updates == [("c-a", "1-2", "0")]  # it runs on 1-2 now
    runtime.time_out = False
    return hook, runtime


async def test_a_move_applied_but_timed_out_is_moved_back_when_its_balloon_shrinks(tmp_path) -> None:
    """Taken for refused, the hook would record it on 1 still, and leave it on 1-2
    when the balloon shrinks back to 1."""
    hook, runtime = await _timed_out_growth(tmp_path)
    await hook.post_stop_pod_sandbox(api_pb2.PodSandboxHookRequest(pod_meta=api_pb2.PodSandboxMetadata(uid="b")))
    assert await hook.apply_moves()
    assert runtime.updates[-1] == ("c-a", "1", "0")
    assert await hook.apply_moves() and len(runtime.updates) == 2  # known where it runs again: done


async def test_a_move_that_timed_out_is_sent_again_at_the_retry(tmp_path) -> None:
    hook, runtime = await _timed_out_growth(tmp_path)
    assert await hook.apply_moves()  # the retry, RETRY_DELAY later: the same target
    assert runtime.updates == [("c-a", "1-2", "0")] * 2
    assert await hook.apply_moves() and len(runtime.updates) == 2


async def test_a_neighbours_growth_moves_containers_off_the_idle_cpus_it_took(tmp_path) -> None:
    """With shareIdleCPUsInSame a balloon's containers run on the idle CPUs too:
    when another balloon takes some, they are moved off them, not left sharing."""
    config = {
        "reservedResources": {"cpu": "cpuset:0"},
        "balloonTypes": [{"name": "work", "namespaces": ["*"], "maxCPUs": 2, "shareIdleCPUsInSame": "system"}],
    }
    hook, runtime = await started(tmp_path, config)
    first = await hook.pre_create_container(request("a", "app", shares=1024))
    assert first.container_resources.cpuset_cpus == "1-7"  # its CPU and the idle ones
    await hook.pre_start_container(request("a", "app", cid="c-a"))
    second = await hook.pre_create_container(request("b", "app", shares=2048))  # a new balloon: two idle CPUs go
    b_cpus = hook.state.pool.balloon_of(("b", "app")).cpus
    assert second.container_resources.cpuset_cpus and len(b_cpus) == 2
    assert await hook.apply_moves()
    ((cid, cpus, _),) = runtime.updates
    assert cid == "c-a" and not parse_cpuset(cpus) & b_cpus


async def test_reconcile_moves_a_container_the_runtime_runs_elsewhere_than_it_was_given(tmp_path) -> None:
    """Its answer was dropped on the way (a timeout under the Ignore policy: kubelet's
    update went through with kubelet's cpuset), so the hook's record of what it gave is wrong."""
    hook, runtime = await started(tmp_path)
    await hook.pre_create_container(request("a", "app", shares=1024))
    await hook.pre_start_container(request("a", "app", cid="c-a"))
    answer = await hook.pre_update_container_resources(request("a", "app", shares=0, cid="c-a"))
    assert answer.container_resources.cpuset_cpus == "1"
    assert await hook.apply_moves() and runtime.updates == []  # as far as the hook knows, it runs on 1
    runtime.live = [FoundContainer("c-a", ("a", "app"), PodContext("apps", "pod-a", "app"), "a", parse_cpuset("0-7"), "0", 1024)]
    await hook.reconcile()
    assert await hook.apply_moves()
    assert runtime.updates == [("c-a", "1", "0")]
    runtime.live = [FoundContainer("c-a", ("a", "app"), PodContext("apps", "pod-a", "app"), "a", parse_cpuset("1"), "0", 1024)]
    await hook.reconcile()
    assert await hook.apply_moves() and len(runtime.updates) == 1  # where it should be: nothing to do


class SpeclessStub:
    """A CRI runtime whose ContainerStatus verbose info has no runtimeSpec
    (cri-dockerd): one running container, c-a of pod a."""

    def __init__(self) -> None:
        self.updates: list[str] = []

    async def ListPodSandbox(self, request: v1.ListPodSandboxRequest, timeout: float | None = None) -> v1.ListPodSandboxResponse:
        meta = v1.PodSandboxMetadata(name="pod-a", uid="a", namespace="apps")
        return v1.ListPodSandboxResponse(items=[v1.PodSandbox(id="p-a", metadata=meta, state=v1.SANDBOX_READY)])

    async def ListContainers(self, request: v1.ListContainersRequest, timeout: float | None = None) -> v1.ListContainersResponse:
        c = v1.Container(id="c-a", pod_sandbox_id="p-a", metadata=v1.ContainerMetadata(name="app"), state=v1.CONTAINER_RUNNING)
        return v1.ListContainersResponse(containers=[c])

    async def ContainerStatus(self, request: v1.ContainerStatusRequest, timeout: float | None = None) -> v1.ContainerStatusResponse:
        return v1.ContainerStatusResponse(status=v1.ContainerStatus(id=request.container_id))  # no info

    async def UpdateContainerResources(
        self, request: v1.UpdateContainerResourcesRequest, timeout: float | None = None
    ) -> v1.UpdateContainerResourcesResponse:
        self.updates.append(request.linux.cpuset_cpus)
        return v1.UpdateContainerResourcesResponse()


class SpeclessClient(RuntimeClient):
    def __init__(self) -> None:
        super().__init__("/fake")
        self.stub = SpeclessStub()

    def _new_stub(self, channel: Any) -> Any:
        return self.stub


async def test_a_container_whose_runtime_shows_no_spec_is_moved_once_not_at_every_reconcile(tmp_path) -> None:
    client = SpeclessClient()
    hook = BalloonsHook(str(tmp_path / "b.sock"), parse_config(CONFIG), topology=Topology.synthetic(1, 1, 8, 1), runtime=client)
    await hook.rebuild()
    assert await hook.apply_moves()
    assert client.stub.updates == ["1"]  # not known to be pinned: placed and moved once
    for _ in range(3):  # three reconcile passes, nothing changed on the node
        await hook.reconcile()
        assert await hook.apply_moves()
    assert client.stub.updates == ["1"]


async def test_mems_written_otherwise_in_the_spec_are_no_move(tmp_path) -> None:
    """The spec says "0,1" where the hook gave "0-1": the same nodes."""
    config = {"reservedResources": {"cpu": "cpuset:0"},
              "balloonTypes": [{"name": "work", "namespaces": ["*"], "shareIdleCPUsInSame": "system"}]}
    runtime = FakeRuntime()
    hook = BalloonsHook(str(tmp_path / "b.sock"), parse_config(config), topology=Topology.synthetic(1, 2, 4, 1), runtime=runtime)
    await hook.rebuild()
    answer = await hook.pre_create_container(request("a", "app", shares=1024))
    assert (answer.container_resources.cpuset_cpus, answer.container_resources.cpuset_mems) == ("1-7", "0-1")
    await hook.pre_start_container(request("a", "app", cid="c-a"))
    runtime.live = [FoundContainer("c-a", ("a", "app"), PodContext("apps", "pod-a", "app"), "a", parse_cpuset("1-7"), "0,1", 1024)]
    await hook.reconcile()
    assert await hook.apply_moves() and runtime.updates == []


class ShrinksDuringTheMove(FakeRuntime):
    """runtimeEndpoint straight at the runtime (no proxy, so no PreUpdate
    answer): while a's move to 1-2 is applied, b's pod stops and a's balloon
    shrinks back to 1."""

    def __init__(self) -> None:
        super().__init__()
        self.hook: BalloonsHook | None = None

    async def update_cpuset(self, container_id: str, cpus: str, mems: str) -> None:
        await super().update_cpuset(container_id, cpus, mems)  # applied: a runs on `cpus`
        if cpus == "1-2":
            assert self.hook is not None
            await self.hook.post_stop_pod_sandbox(api_pb2.PodSandboxHookRequest(pod_meta=api_pb2.PodSandboxMetadata(uid="b")))


async def test_a_move_applied_while_its_balloon_shrank_back_is_moved_back(tmp_path) -> None:
    runtime = ShrinksDuringTheMove()
    hook, _ = await started(tmp_path, runtime=runtime)
    runtime.hook = hook
    await grow_as_balloon(hook)
    await hook.apply_moves()
    assert runtime.updates == [("c-a", "1-2", "0")]  # a runs on 1-2; its balloon is 1 again
    await hook.apply_moves()
    assert runtime.updates == [("c-a", "1-2", "0"), ("c-a", "1", "0")]  # moved back off CPU 2


class ReplansDuringTheMove(ShrinksDuringTheMove):
    """As ShrinksDuringTheMove, then a config reload (or a hotplug) re-plans
    the balloons before the move's answer is taken: the new plan has a on 1,
    the cpuset it was given before the move."""

    def __init__(self, config_path) -> None:
        super().__init__()
        self.config_path = config_path

    async def update_cpuset(self, container_id: str, cpus: str, mems: str) -> None:
        await super().update_cpuset(container_id, cpus, mems)
        if cpus == "1-2":
            assert self.hook is not None and await self.hook.reload(self.config_path)


async def test_a_move_applied_while_a_replan_put_its_container_back_is_moved_back(tmp_path) -> None:
    """The re-plan did not carry how many cpusets a had been given: the move's
    answer was taken for one PreUpdate made instead, and a stayed on 1-2."""
    path = tmp_path / "balloons.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    runtime = ReplansDuringTheMove(path)
    hook, _ = await started(tmp_path, runtime=runtime)
    runtime.hook = hook
    await grow_as_balloon(hook)
    await hook.apply_moves()
    assert runtime.updates == [("c-a", "1-2", "0")]
    await hook.apply_moves()
    assert runtime.updates == [("c-a", "1-2", "0"), ("c-a", "1", "0")]  # moved back off CPU 2


class ShrinksBeforePreUpdate(ProxiedRuntime):
    """Through the proxy: b's pod stops while a's move to 1-2 is on its way, so
    PreUpdate answers a's old cpuset, and the proxy sends that to the runtime."""

    async def update_cpuset(self, container_id: str, cpus: str, mems: str) -> None:
        assert self.hook is not None
        if cpus == "1-2":
            await self.hook.post_stop_pod_sandbox(api_pb2.PodSandboxHookRequest(pod_meta=api_pb2.PodSandboxMetadata(uid="b")))
        resources = await self.pre_update(container_id)
        await FakeRuntime.update_cpuset(self, container_id, resources.cpuset_cpus, resources.cpuset_mems)


async def test_a_move_whose_preupdate_answered_its_old_cpuset_is_recorded_as_answered(tmp_path) -> None:
    runtime = ShrinksBeforePreUpdate()
    hook = await proxied(tmp_path, runtime)
    await grow_as_balloon(hook)
    await hook.apply_moves()
    assert runtime.updates == [("c-a", "1", "0")]  # the runtime applied PreUpdate's answer
    assert hook.state.applied[("a", "app")] == ("1", "0")  # what it runs on
    await hook.apply_moves()
    assert runtime.updates == [("c-a", "1", "0")]  # no move left to make
