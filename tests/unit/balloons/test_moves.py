"""Moves of running containers whose balloon changed, when the runtime fails one.

The hook moves a container through the proxy (runtimeEndpoint): the move's
UpdateContainerResources passes this hook's PreUpdateContainerResources
before the runtime is called, so the hook has answered the new cpuset
before it can know whether the runtime applies it.
"""

from __future__ import annotations

import grpc

from hooks.balloons.config import PodContext
from hooks.balloons.runtime import FoundContainer
from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import parse_cpuset

from .test_server import FakeRuntime, request, started


class ProxiedRuntime(FakeRuntime):
    """A move goes through the hook's PreUpdateContainerResources (as the proxy
    sends it, with the container's spec shares), then reaches the runtime,
    which fails it while ``fail_with`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.hook: BalloonsHook | None = None
        self.pod_of: dict[str, tuple[str, str]] = {}  # container id -> (pod uid, name)

    async def update_cpuset(self, container_id: str, cpus: str, mems: str) -> None:
        assert self.hook is not None
        uid, name = self.pod_of[container_id]
        answer = await self.hook.pre_update_container_resources(request(uid, name, shares=1024, cid=container_id))
        assert answer.container_resources.cpuset_cpus == cpus  # the proxy would send the hook's answer
        await super().update_cpuset(container_id, cpus, mems)


async def test_a_move_the_runtime_failed_is_retried(tmp_path) -> None:
    runtime = ProxiedRuntime()
    hook, _ = await started(tmp_path, runtime=runtime)
    runtime.hook = hook
    runtime.pod_of = {"c-a": ("a", "app")}
    await hook.pre_create_container(request("a", "app", shares=1024))
    await hook.pre_start_container(request("a", "app", cid="c-a"))
    await hook.pre_create_container(request("b", "app", shares=1024))  # a's balloon grows to 1-2
    runtime.fail_with = grpc.StatusCode.UNKNOWN  # e.g. runc failed the update
    assert not await hook.apply_moves()
    assert runtime.updates == []  # c-a still runs on "1"
    runtime.fail_with = None
    assert await hook.apply_moves()  # the retry, RETRY_DELAY later
    assert runtime.updates == [("c-a", "1-2", "0")]
    assert await hook.apply_moves() and len(runtime.updates) == 1  # and then it is done


async def test_a_failed_move_of_a_never_pinned_container_keeps_it_unpinned_for_a_reload(tmp_path) -> None:
    """First seen at its start (no answer applied): a failed move leaves it as it
    was, not pinned, so a rebuild places it anew rather than from a cpuset it never had."""
    runtime = ProxiedRuntime()
    hook, _ = await started(tmp_path, runtime=runtime)
    runtime.hook = hook
    runtime.pod_of = {"c-a": ("a", "app")}
    await hook.pre_start_container(request("a", "app", shares=1024, cid="c-a"))
    runtime.fail_with = grpc.StatusCode.UNAVAILABLE
    assert not await hook.apply_moves()
    (restored,) = hook.state.restored()
    assert restored.cpus == frozenset()
    runtime.fail_with = None
    assert await hook.apply_moves() and runtime.updates == [("c-a", "1", "0")]


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
