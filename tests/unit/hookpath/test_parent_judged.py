"""On cgroup v1 a hook's cpusets are judged by the pod cgroup parent's too:
refused (Fail) or dropped (Ignore) with the parent named, read afresh for
each answer naming a cpuset and never for others (a fake tree stands for
this node's sysfs and cpuset hierarchy)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import pytest

from cri_api.hookapi import api_pb2 as hookapi
from runtimeproxy.hookpath.dispatch import Dispatcher, HookError
from runtimeproxy.hookpath.hookfile import FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.nodefacts import NodeFactsSource
from runtimeproxy.hookpath.parentcpuset import ParentCpusets
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.validate import NodeFacts, ParentCpuset, read_node_facts
from runtimeproxy.metrics import Metrics
from tests.fakesysfs import CPUSET_MOUNT, cgroup_v1_cpuset, fake_root, set_cgroup_cpuset, set_online_cpus

from .dispatchfakes import Chain, NoConnections

CREATE, UPDATE = HookType.PRE_CREATE_CONTAINER, HookType.PRE_UPDATE_CONTAINER_RESOURCES
POD = "/kubepods/burstable/podx"
NARROW = "/kubepods/besteffort/pody"
SLICE = "kubepods-burstable-podx.slice"
SLICE_PATH = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice"


class Answers(NoConnections):
    def __init__(self, answer: hookapi.ContainerResourceHookResponse) -> None:
        self.answer = answer

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        return self.answer.SerializeToString()


class Counted(ParentCpusets):
    def __init__(self, root: Path) -> None:
        super().__init__(root / CPUSET_MOUNT)
        self.reads = 0
        self.files: list[str] = []

    def read(self, cgroup_parent: str, *fields: Collection[str]) -> ParentCpuset | None:
        self.reads += 1
        return super().read(cgroup_parent, *fields)

    def _read_text(self, path: str) -> str:
        self.files.append(path.removeprefix(str(self._mount)))
        return super()._read_text(path)


class Node:
    """CPUs 0-3 online; the pod's parent on 0-1 (node 0), another on CPU 0."""

    def __init__(self, tmp_path: Path, policy: FailurePolicy = FailurePolicy.FAIL, **answer: object) -> None:
        self.now = 100.0
        self.root = fake_root(tmp_path, cpus="0-3\n", nodes=None)
        cgroup_v1_cpuset(self.root, {"/": ("0-3", "0"), POD: ("0-1", "0"), NARROW: ("0", "0")})
        self.node_reads = 0
        self.parents = Counted(self.root)
        self.metrics = Metrics()
        self.server = HookServerConfig("pin.json", "/run/pin.sock", policy, frozenset({CREATE, UPDATE}), timeout=1.0)
        self.transport = Answers(hookapi.ContainerResourceHookResponse(**answer))  # type: ignore[arg-type]
        self.source = NodeFactsSource(self._read_node, parents=self.parents, clock=lambda: self.now)
        self.dispatcher = Dispatcher(
            Chain(self.server), self.metrics, node=self.source, transport=self.transport  # type: ignore[arg-type]
        )

    def _read_node(self) -> NodeFacts:
        self.node_reads += 1
        return read_node_facts(self.root)

    async def taken(self, hook: HookType = CREATE, **request: object) -> bool:
        """Whether the answer goes on (False: dropped under Ignore); HookError when refused under Fail."""
        applied: list[object] = []

        async def build() -> hookapi.ContainerResourceHookRequest:
            return hookapi.ContainerResourceHookRequest(**{"pod_cgroup_parent": POD, **request})  # type: ignore[arg-type]

        await self.dispatcher.run_pre(hook, build, lambda answer, server: applied.append(answer) is None, {})
        return applied != []

    def outcome(self, hook: HookType = CREATE) -> float:
        labels = {"server": "pin.json", "hook": hook.value, "outcome": "invalid_value"}
        return self.metrics.registry.get_sample_value("runtime_proxy_hook_calls_total", labels) or 0.0


def pinned(cpus: str = "", mems: str = "", parent: str = "") -> dict[str, object]:
    return {"container_resources": hookapi.LinuxContainerResources(cpuset_cpus=cpus, cpuset_mems=mems),
            "pod_cgroup_parent": parent}


@pytest.mark.parametrize("hook", [CREATE, UPDATE])
async def test_cpus_outside_the_parents_are_refused_under_fail_naming_the_parent(tmp_path: Path, hook: HookType) -> None:
    node = Node(tmp_path, **pinned("2-3"))
    with pytest.raises(HookError) as refused:
        await node.taken(hook)
    assert refused.value.cause == (
        "answer carries values the kernel would refuse: "
        f"cpuset_cpus '2-3' names CPUs outside the parent cgroup {POD} (2,3; it has 0-1)"
    )
    assert node.outcome(hook) == 1
    assert node.node_reads == 2  # read again before the parent is named (a CPU gone offline is the node's)
    with pytest.raises(HookError):
        await node.taken(hook)
    assert node.node_reads == 2  # and that read found nothing new: the next held off


async def test_under_ignore_the_answer_is_dropped(tmp_path: Path) -> None:
    node = Node(tmp_path, FailurePolicy.IGNORE, **pinned("1", "0"))
    assert await node.taken()
    node.transport.answer.container_resources.cpuset_cpus = "3"
    assert not await node.taken()
    assert node.outcome() == 1


async def test_a_parent_widened_since_is_taken_at_once(tmp_path: Path) -> None:
    node = Node(tmp_path, **pinned("2"))
    with pytest.raises(HookError):
        await node.taken()
    set_cgroup_cpuset(node.root, POD, "0-3", "0")  # kubelet's CPU manager gave the pod more
    assert await node.taken()
    assert node.parents.reads == 2


async def test_an_answer_naming_no_cpuset_reads_no_parent(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.transport.answer.container_resources.cpu_quota = 20_000
    assert await node.taken(container_resources=hookapi.LinuxContainerResources(cpuset_cpus="3"))
    assert node.parents.reads == 0


async def test_a_cpuset_the_node_refuses_is_named_once_by_the_node(tmp_path: Path) -> None:
    node = Node(tmp_path, **pinned("7"))
    with pytest.raises(HookError) as refused:
        await node.taken()
    assert refused.value.cause.endswith("cpuset_cpus '7' names CPUs this node does not have online (7)")
    assert node.parents.reads == 0


async def test_a_cpuset_set_with_a_move_at_create_is_judged_by_the_new_parent(tmp_path: Path) -> None:
    node = Node(tmp_path, **pinned("1", parent=NARROW))
    with pytest.raises(HookError) as refused:
        await node.taken()
    assert refused.value.cause.endswith(f"cpuset_cpus '1' names CPUs outside the parent cgroup {NARROW} (1; it has 0)")
    node.transport.answer.container_resources.cpuset_cpus = "0"
    assert await node.taken()


async def test_an_update_is_judged_by_the_parent_it_has(tmp_path: Path) -> None:
    """UpdateContainerResources applies no cgroup parent: an answer's is not the container's."""
    node = Node(tmp_path, **pinned("1", parent=NARROW))
    assert await node.taken(UPDATE)


async def test_a_pod_without_cgroup_parent_is_not_judged(tmp_path: Path) -> None:
    """The runtime's own default parent (containerd's /k8s.io) is not a hook's doing."""
    node = Node(tmp_path, **pinned("3"))
    assert await node.taken(pod_cgroup_parent="")
    assert node.parents.reads == 0


async def test_an_echo_of_the_cpuset_shown_reads_nothing(tmp_path: Path) -> None:
    """Koordinator-style hooks answer with the full resources: kubelet's cpuset
    (outside the parent since it shrank, say) is not theirs, nor read for."""
    node = Node(tmp_path, **pinned("3", "0"))
    node.transport.answer.container_resources.cpu_quota = 20_000
    assert await node.taken(container_resources=hookapi.LinuxContainerResources(cpuset_cpus="3", cpuset_mems="0"))
    assert node.parents.reads == 0


@pytest.mark.parametrize(("parent", "answered"), [
    (POD, NARROW),
    (POD, f"{POD}/"),
    (SLICE_PATH, SLICE),
    (SLICE, SLICE_PATH),
])
async def test_a_move_leaves_the_cpuset_it_does_not_set_unjudged(tmp_path: Path, parent: str, answered: str) -> None:
    """kubelet's cpuset (CPU 1, or 3 since the parent shrank) is not the hook's,
    whatever parent it chose: in a chain, a later hook may still set it (if
    none does, runc fails the container as it would without the proxy)."""
    node = Node(tmp_path, **pinned(parent=answered))
    set_cgroup_cpuset(node.root, SLICE_PATH, "0-1", "0")
    for cpus in ("", "1", "3"):
        assert await node.taken(pod_cgroup_parent=parent, container_resources=hookapi.LinuxContainerResources(cpuset_cpus=cpus))
    assert node.parents.reads == 0


async def test_only_the_files_of_the_fields_set_are_read_in_one_walk(tmp_path: Path) -> None:
    node = Node(tmp_path, **pinned("1", "0"))
    assert await node.taken(container_resources=hookapi.LinuxContainerResources(cpuset_mems="0"))
    assert node.parents.files == [f"{POD}/cpuset.cpus"]  # the mems are echoed
    node.parents.files.clear()
    assert await node.taken(pod_cgroup_parent=f"{POD}/not-made")
    # The parent not made: one failed open there, then both files at the pod's.
    assert node.parents.files == [f"{POD}/not-made/cpuset.cpus", f"{POD}/cpuset.cpus", f"{POD}/cpuset.mems"]


async def test_a_cpu_taken_offline_is_the_nodes_reason_not_the_parents(tmp_path: Path) -> None:
    """The kernel drops it from every cpuset at once; the node's facts are not
    that old (max_age), and widening the parent would fail (EINVAL)."""
    node = Node(tmp_path, **pinned("3"))
    set_cgroup_cpuset(node.root, POD, "0-3", "0")
    set_online_cpus(node.root, "0-2\n")
    set_cgroup_cpuset(node.root, POD, "0-2", "0")
    with pytest.raises(HookError) as refused:
        await node.taken()
    assert refused.value.cause.endswith("cpuset_cpus '3' names CPUs this node does not have online (3)")
    assert node.node_reads == 2


async def test_a_parent_with_a_nul_is_not_judged(tmp_path: Path) -> None:
    """No cgroup has one (os.open raises ValueError): not the hook call's error."""
    node = Node(tmp_path, **pinned("3", parent="/kubepods/x\0y"))
    assert await node.taken()
    labels = {"server": "pin.json", "hook": CREATE.value, "outcome": "ok"}
    assert node.metrics.registry.get_sample_value("runtime_proxy_hook_calls_total", labels) == 1


async def test_a_parents_fruitless_read_holds_off_no_read_for_a_cpu_come_online(tmp_path: Path) -> None:
    """The node's facts read in vain before a parent's refusal do not hold off
    the read for another answer naming a CPU brought online since."""
    node = Node(tmp_path, **pinned("2-3"))
    with pytest.raises(HookError):
        await node.taken()  # t=100.0: outside the parent, the facts read in vain
    node.now = 100.3
    set_online_cpus(node.root, "0-4\n")
    set_cgroup_cpuset(node.root, POD, "0-4", "0")
    node.now = 100.5
    node.transport.answer.container_resources.cpuset_cpus = "4"
    assert await node.taken()
    assert node.node_reads == 3


class ByEndpoint(NoConnections):
    def __init__(self, answers: dict[str, hookapi.ContainerResourceHookResponse]) -> None:
        self.answers = answers

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        return self.answers[endpoint].SerializeToString()


ISO = "/kubepods/isolated"


async def chain(tmp_path: Path, second: dict[str, object]) -> hookapi.ContainerResourceHookRequest:
    """Hook a moves the container (kubelet's cpuset 0-1) to ISO, CPUs 2-3, and
    sets no cpuset; hook b answers ``second``. The request as the chain leaves it."""
    node = Node(tmp_path)
    set_cgroup_cpuset(node.root, ISO, "2-3", "0")
    servers = [HookServerConfig(f"{n}.json", f"/run/{n}.sock", FailurePolicy.FAIL, frozenset({CREATE}), timeout=1.0)
               for n in ("a", "b")]
    transport = ByEndpoint({
        "/run/a.sock": hookapi.ContainerResourceHookResponse(pod_cgroup_parent=ISO),
        "/run/b.sock": hookapi.ContainerResourceHookResponse(**second),  # type: ignore[arg-type]
    })
    dispatcher = Dispatcher(Chain(*servers), node.metrics, node=node.source, transport=transport)  # type: ignore[arg-type]
    request = hookapi.ContainerResourceHookRequest(
        pod_cgroup_parent=POD, container_resources=hookapi.LinuxContainerResources(cpuset_cpus="0-1")
    )

    async def build() -> hookapi.ContainerResourceHookRequest:
        return hookapi.ContainerResourceHookRequest.FromString(request.SerializeToString())

    def apply(answer: hookapi.ContainerResourceHookResponse, server: object) -> bool:
        request.pod_cgroup_parent = answer.pod_cgroup_parent or request.pod_cgroup_parent
        request.container_resources.cpuset_cpus = answer.container_resources.cpuset_cpus or request.container_resources.cpuset_cpus
        return True

    await dispatcher.run_pre(CREATE, build, apply, {})
    return request


async def test_a_chain_is_judged_answer_by_answer_by_the_parent_each_leaves(tmp_path: Path) -> None:
    """a's move leaves kubelet's cpuset to b, which narrows it within ISO: the
    request the chain leaves is one the kernel takes (a was refused for
    kubelet's 0-1 judged against ISO)."""
    request = await chain(tmp_path, {"container_resources": hookapi.LinuxContainerResources(cpuset_cpus="2-3")})
    assert (request.pod_cgroup_parent, request.container_resources.cpuset_cpus) == (ISO, "2-3")


async def test_a_later_hooks_cpuset_is_judged_by_the_parent_an_earlier_one_moved_to(tmp_path: Path) -> None:
    with pytest.raises(HookError) as refused:
        await chain(tmp_path, {"container_resources": hookapi.LinuxContainerResources(cpuset_cpus="1-2")})
    assert refused.value.server.name == "b.json"
    assert refused.value.cause.endswith(f"cpuset_cpus '1-2' names CPUs outside the parent cgroup {ISO} (1; it has 2-3)")


async def test_a_move_to_a_path_whose_slice_depends_on_the_driver_is_not_judged(tmp_path: Path) -> None:
    """Under cgroupfs the container goes under /a/rt.slice, CPUs 0-3; only
    under systemd would it go under /rt.slice, CPU 0 (the driver is not known)."""
    node = Node(tmp_path, **pinned("2-3", parent="/a/rt.slice"))
    set_cgroup_cpuset(node.root, "/a/rt.slice", "0-3", "0")
    set_cgroup_cpuset(node.root, "/rt.slice", "0", "0")
    assert await node.taken()
    assert node.parents.reads == 1 and node.parents.files == []
