"""NRI objects as CRI requests, hook answers back as NRI adjustments, and
what NRI cannot apply or wait for."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.nri import api_pb2 as nri
from runtimeproxy.hookpath.hookfile import FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.registry import HookSnapshot
from runtimeproxy.nri import convert
from runtimeproxy.nri.app import NriSettings
from runtimeproxy.nri.limits import HOOK_DEADLINE, ClampedRegistry, unapplied
from tests.fakeclock import frozen_time


def container() -> nri.Container:
    return nri.Container(
        id="c1", name="app", env=["A=1", "B=x=y"], annotations={"k": "v"},
        linux=nri.LinuxContainer(
            cgroups_path="/kubepods/pod1/c1",
            oom_score_adj=nri.OptionalInt(value=-997),
            resources=nri.LinuxResources(
                cpu=nri.LinuxCPU(shares=nri.OptionalUInt64(value=2), cpus="0-1"),
                memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=100)),
                unified={"memory.high": "90"},
            ),
        ),
    )


def test_container_as_cri_config() -> None:
    config = convert.container_config(container())
    assert [(kv.key, kv.value) for kv in config.envs] == [("A", b"1"), ("B", b"x=y")]
    r = config.linux.resources
    assert (r.cpu_shares, r.cpuset_cpus, r.memory_limit_in_bytes, dict(r.unified)) == (2, "0-1", 100, {"memory.high": "90"})
    assert r.oom_score_adj == -997  # kubelet's, as hooks see it behind the CRI proxy


def test_container_attempt_is_kubelets_restart_count(caplog: pytest.LogCaptureFixture) -> None:
    """NRI's Container has no attempt: the hooks are told kubelet's restart
    count annotation, as the CRI proxy tells them the request's attempt (a
    hook keyed by (name, attempt) otherwise sees every restart as attempt 0);
    a missing or garbled one is attempt 0, said at debug level."""
    restarted = container()
    restarted.annotations["io.kubernetes.container.restartCount"] = "3"
    assert convert.create_request(nri.PodSandbox(id="p1"), restarted).config.metadata.attempt == 3
    assert convert.container_config(container()).metadata.attempt == 0
    caplog.set_level("DEBUG", "runtimeproxy.nri.convert")
    garbles = ("x", "-1", str(2**32), "+3", " 3", "3_0", "\u0663")  # (the last: ARABIC-INDIC DIGIT THREE, int() takes it)
    for garbled in garbles:
        restarted.annotations["io.kubernetes.container.restartCount"] = garbled
        assert convert.container_config(restarted).metadata.attempt == 0
    assert [r.value for r in caplog.records] == list(garbles)
    assert {r.container_id for r in caplog.records} == {restarted.id}  # (a name is not unique across pods)


def test_adjustment_carries_only_what_hooks_changed() -> None:
    pod = nri.PodSandbox(id="p1", linux=nri.LinuxPodSandbox(cgroup_parent="/kubepods/pod1"))
    before = convert.create_request(pod, container())
    after = convert.create_request(pod, container())
    after.config.annotations["new"] = "1"
    after.config.envs[0].value = b"2"
    after.config.envs.add(key="C", value=b"3")
    r = after.config.linux.resources
    r.cpu_quota, r.cpu_period, r.cpu_shares, r.cpuset_mems, r.memory_limit_in_bytes = 5000, 10000, 2, "0", 200
    r.unified["memory.high"] = "80"
    after.sandbox_config.linux.cgroup_parent = "/kubepods/besteffort/pod1"
    adjust = convert.container_adjustment(container(), before, after)
    assert dict(adjust.annotations) == {"new": "1"}
    assert [(kv.key, kv.value) for kv in adjust.env] == [("A", "2"), ("C", "3")]
    cpu, memory = adjust.linux.resources.cpu, adjust.linux.resources.memory
    assert (cpu.quota.value, cpu.period.value, cpu.mems, memory.limit.value) == (5000, 10000, "0", 200)
    assert not cpu.HasField("shares") and cpu.cpus == ""
    assert dict(adjust.linux.resources.unified) == {"memory.high": "80"}
    assert adjust.linux.cgroups_path == "/kubepods/besteffort/pod1/c1"


def test_unchanged_means_no_adjustment_and_no_update() -> None:
    pod = nri.PodSandbox(id="p1")
    request = convert.create_request(pod, container())
    assert convert.container_adjustment(container(), request, request) == nri.ContainerAdjustment()
    update = convert.update_request(container(), container().linux.resources)
    assert convert.container_update(update, update) == []


@pytest.mark.parametrize(
    ("path", "parent", "expected"),
    [
        ("/kubepods/pod1/c1", "/kubepods/besteffort/pod1", "/kubepods/besteffort/pod1/c1"),
        ("kubepods-pod1.slice:cri-containerd:c1", "kubepods-besteffort-pod1.slice",
         "kubepods-besteffort-pod1.slice:cri-containerd:c1"),
        # kubelet's systemd parent, expanded: containerd (and runc) take its last slice
        ("kubepods-burstable-pod1.slice:cri-containerd:c1",
         "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice",
         "kubepods-besteffort-pod1.slice:cri-containerd:c1"),
        ("/kubepods/pod1/c1", "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice",
         "kubepods-besteffort-pod1.slice:cri-containerd:c1"),
        ("kubepods-pod1.slice:cri-containerd:c1", "/custom/pod1", "/custom/pod1/c1"),
    ],
)
def test_cgroups_path_under_another_parent(path: str, parent: str, expected: str) -> None:
    assert convert.cgroups_path_under(path, parent) == expected


def test_containerds_default_swap_is_shown_as_kubelet_sent_it_and_kept_by_updates() -> None:
    # containerd sets swap = limit when kubelet sets none: a hook raising the
    # limit must not be refused for a swap below it, and an update keeps the rule.
    limited = nri.LinuxResources(memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=1 << 30), swap=nri.OptionalInt64(value=1 << 30)))
    assert convert.cri_resources(limited).memory_swap_limit_in_bytes == 0
    own = nri.LinuxResources(memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=1 << 30), swap=nri.OptionalInt64(value=2 << 30)))
    assert convert.cri_resources(own).memory_swap_limit_in_bytes == 2 << 30
    before = convert.update_request(container(), limited)
    after = convert.update_request(container(), limited)
    after.linux.memory_limit_in_bytes = 2 << 30
    memory = convert.container_update(before, after)[0].linux.resources.memory
    assert (memory.limit.value, memory.swap.value) == (2 << 30, 2 << 30)


def test_unapplied_answers_per_hook_point() -> None:
    request = hookapi.ContainerResourceHookRequest(container_annotations={"a": "1"})
    echo = hookapi.ContainerResourceHookResponse(container_annotations={"a": "1"})
    assert unapplied(HookType.PRE_START_CONTAINER, request, echo) == []  # an echo changes nothing
    answer = hookapi.ContainerResourceHookResponse(
        container_annotations={"a": "2"},
        container_resources=hookapi.LinuxContainerResources(cpu_quota=1, oom_score_adj=5),
    )
    assert unapplied(HookType.PRE_START_CONTAINER, request, answer) == [
        "container_annotations", "container_resources.cpu_quota", "container_resources.oom_score_adj"
    ]
    assert unapplied(HookType.PRE_CREATE_CONTAINER, request, answer) == ["container_resources.oom_score_adj"]
    swap = hookapi.ContainerResourceHookResponse(container_resources=hookapi.LinuxContainerResources(memory_swap_limit_in_bytes=-1))
    assert unapplied(HookType.PRE_CREATE_CONTAINER, request, swap) == ["container_resources.memory_swap_limit_in_bytes"]
    assert unapplied(HookType.PRE_UPDATE_CONTAINER_RESOURCES, request, swap) == []  # an update's swap is applied
    assert unapplied(HookType.PRE_UPDATE_CONTAINER_RESOURCES, request, answer) == [
        "container_annotations", "container_resources.oom_score_adj"
    ]
    assert unapplied(HookType.POST_START_CONTAINER, request, answer) == []


class _Registry:
    """A HookSource of fixed servers."""

    def __init__(self, servers: tuple[HookServerConfig, ...]) -> None:
        self._snapshot = HookSnapshot({server.name: server for server in servers})

    @property
    def snapshot(self) -> HookSnapshot:
        return self._snapshot

    def servers_for(self, hook: HookType) -> tuple[HookServerConfig, ...]:
        return self._snapshot.servers_for(hook)

    def on_change(self, callback: object) -> None:
        return None


def _server(name: str, timeout: float) -> HookServerConfig:
    return HookServerConfig(name, f"/run/{name}.sock", FailurePolicy.FAIL, frozenset(HookType), timeout)


async def test_timeouts_clamped_and_a_chain_gets_what_is_left() -> None:
    clamped = ClampedRegistry(_Registry((_server("a", 0.5), _server("b", 30.0))), limit=1.6)  # type: ignore[arg-type]
    assert [s.timeout for s in clamped.servers_for(HookType.PRE_CREATE_CONTAINER)] == [0.5, 1.6]
    assert [s.timeout for s in clamped.servers_for(HookType.POST_START_CONTAINER)] == [0.5, 1.6]
    with frozen_time(asyncio.get_running_loop()) as now:  # (before: 0.1 s of slack against a moving clock)
        token = HOOK_DEADLINE.set(now + 1.0)
        try:
            timeouts = [s.timeout for s in clamped.servers_for(HookType.PRE_CREATE_CONTAINER)]
            post = [s.timeout for s in clamped.servers_for(HookType.POST_START_CONTAINER)]
        finally:
            HOOK_DEADLINE.reset(token)
    assert timeouts[0] == 0.5 and timeouts[1] == pytest.approx(1.0)
    assert post == [0.5, 1.6]  # post hooks run after the answer: no deadline


def test_settings_from_the_runtime_environment() -> None:
    base = NriSettings(hook_dir=Path("/h"), name="mine", index="10")
    assert NriSettings.from_environment(base, {}) == base
    started = NriSettings.from_environment(
        base, {"NRI_PLUGIN_SOCKET": "3", "NRI_PLUGIN_NAME": "theirs", "NRI_PLUGIN_IDX": "05"}
    )
    assert (started.socket_fd, started.name, started.index) == (3, "theirs", "05")
    assert base.budget == pytest.approx(1.5)  # 2 s less the margin for the answer's way back
