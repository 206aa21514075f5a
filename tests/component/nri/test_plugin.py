"""The NRI plugin against a fake runtime: registration, synchronize, every
event through the proxy's hook path, with real hook-server processes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cri_api.nri import api_pb2 as nri
from runtimeproxy.hookpath.validate import NodeFactsReader
from runtimeproxy.nri.adapter import SUBSCRIBED
from tests.fakesysfs import cgroup_v1_cpuset, fake_root, parent_cpusets_of, set_online_cpus

from ...hookprocs import hook_server
from .conftest import container, pod
from .fakeruntime import Refused

E = nri.Event
QUOTA_HOOK = {
    "PreCreateContainer": {
        "container_resources": {"cpu_period": 100000, "cpu_quota": 20000, "memory_limit_in_bytes": 67108864,
                                "cpuset_cpus": "0", "cpuset_mems": "0"},
        "container_annotations": {"hooked-by": "quota"},
        "container_envs": {"HOOKED": "1", "KEEP": "overridden"},
    }
}


async def test_registration_configure_and_synchronize(runtime, start_plugin) -> None:
    plugin = await start_plugin(name="rp", index="07")
    link = await runtime.next_link()
    events = await link.handshake([pod()], [container()])
    registered = link.registered.result()
    assert (registered.plugin_name, registered.plugin_idx) == ("rp", "07")
    assert events == sum(1 << (e - 1) for e in SUBSCRIBED)
    assert events & (1 << (E.CREATE_CONTAINER - 1)) and events & (1 << (E.POST_START_CONTAINER - 1))
    assert not events & (1 << (E.POST_CREATE_CONTAINER - 1))
    # Synchronize filled the proxy's store.
    assert plugin.store.pods["pod-1"].labels == {"app": "web"}
    assert plugin.store.containers["ctr-1"].pod_meta.uid == "uid-1"
    assert plugin.store.container_pod["ctr-1"] == "pod-1"


async def test_create_container_becomes_the_adjustment(connect, sock_dir, hook_dir) -> None:
    async with hook_server(sock_dir, "quota", QUOTA_HOOK) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        _, link = await connect([pod()])
        answer = await link.create_container(pod(), container())
    adjust = answer.adjust
    cpu, memory = adjust.linux.resources.cpu, adjust.linux.resources.memory
    assert (cpu.period.value, cpu.quota.value, memory.limit.value) == (100000, 20000, 64 << 20)
    assert (cpu.cpus, cpu.mems) == ("0", "0")
    assert not cpu.HasField("shares")  # unchanged by the hook: not adjusted
    assert dict(adjust.annotations) == {"hooked-by": "quota"}
    assert sorted((kv.key, kv.value) for kv in adjust.env) == [("HOOKED", "1"), ("KEEP", "overridden")]
    assert adjust.linux.cgroups_path == ""
    seen = hook.requests("PreCreateContainer")[0]
    assert seen["pod_meta"] == {"name": "web", "uid": "uid-1", "namespace": "default"}
    assert seen["pod_labels"] == {"app": "web"}
    assert seen["pod_annotations"] == {"pod-note": "x"}
    assert seen["pod_cgroup_parent"] == "/kubepods/burstable/poduid-1"
    assert seen["container_envs"] == {"PATH": "/bin", "KEEP": "original"}
    assert seen["container_resources"]["cpu_shares"] == "256"


async def test_a_cpu_brought_online_after_start_may_be_handed_out(
    connect, sock_dir, hook_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = fake_root(tmp_path, cpus="0-3\n", nodes=None)
    monkeypatch.setattr("runtimeproxy.nri.app.NodeFactsReader", lambda: NodeFactsReader(root))
    monkeypatch.setattr("runtimeproxy.nri.app.ParentCpusets", parent_cpusets_of(root))  # no cpuset hierarchy: not judged
    script = {"PreCreateContainer": {"container_resources": {"cpuset_cpus": "4"}}}
    async with hook_server(sock_dir, "pin", script) as hook:
        hook.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail")
        _, link = await connect([pod()])  # the plugin reads the node's facts: CPUs 0-3
        set_online_cpus(root, "0-4\n")
        answer = await link.create_container(pod(), container())
    assert answer.adjust.linux.resources.cpu.cpus == "4"


async def test_on_cgroup_v1_cpus_outside_the_pods_parent_refuse_the_container(
    connect, sock_dir, hook_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused by the hook's failure policy, naming the parent, not by runc's EACCES."""
    root = fake_root(tmp_path, cpus="0-3\n", nodes=None)
    cgroup_v1_cpuset(root, {"/": ("0-3", "0"), pod().linux.cgroup_parent: ("0-1", "0")})
    monkeypatch.setattr("runtimeproxy.nri.app.NodeFactsReader", lambda: NodeFactsReader(root))
    monkeypatch.setattr("runtimeproxy.nri.app.ParentCpusets", parent_cpusets_of(root))
    script = {"PreCreateContainer": {"container_resources": {"cpuset_cpus": "3"}}}
    async with hook_server(sock_dir, "pin", script) as hook:
        hook.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail")
        _, link = await connect([pod()])
        with pytest.raises(Refused) as refused:
            await link.create_container(pod(), container())
    assert "cpuset_cpus '3' names CPUs outside the parent cgroup /kubepods/burstable/poduid-1 (3; it has 0-1)" in (
        refused.value.message
    )


async def test_after_a_resynchronize_a_moved_container_is_judged_by_the_parent_it_is_under(
    connect, sock_dir, hook_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PreCreateContainer hook moved it to /kubepods/isolated (CPUs 2-3, the
    pod's parent has 0-1); containerd restarted and synchronized it back."""
    root = fake_root(tmp_path, cpus="0-3\n", nodes=None)
    cgroup_v1_cpuset(root, {"/": ("0-3", "0"), pod().linux.cgroup_parent: ("0-1", "0"), "/kubepods/isolated": ("2-3", "0")})
    monkeypatch.setattr("runtimeproxy.nri.app.NodeFactsReader", lambda: NodeFactsReader(root))
    monkeypatch.setattr("runtimeproxy.nri.app.ParentCpusets", parent_cpusets_of(root))
    moved = container()
    moved.linux.cgroups_path = "/kubepods/isolated/ctr-1"
    script = {"PreUpdateContainerResources": {"container_resources": {"cpuset_cpus": "2-3"}}}
    async with hook_server(sock_dir, "pin", script) as hook:
        hook.register(hook_dir, ["PreUpdateContainerResources"], failure_policy="Fail")
        _, link = await connect([pod()], [moved])
        wanted = nri.LinuxResources(cpu=nri.LinuxCPU(quota=nri.OptionalInt64(value=50000)))
        answer = await link.call(
            "UpdateContainer",
            nri.UpdateContainerRequest(pod=pod(), container=moved, linux_resources=wanted),
            nri.UpdateContainerResponse,
        )
    [update] = answer.update
    assert update.linux.resources.cpu.cpus == "2-3"
    assert hook.requests("PreUpdateContainerResources")[0]["pod_cgroup_parent"] == "/kubepods/isolated"


async def test_cgroup_parent_becomes_the_cgroups_path(connect, sock_dir, hook_dir) -> None:
    script = {"PreCreateContainer": {"pod_cgroup_parent": "/kubepods/besteffort/poduid-1"}}
    async with hook_server(sock_dir, "parent", script) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        _, link = await connect([pod()])
        answer = await link.create_container(pod(), container())
    assert answer.adjust.linux.cgroups_path == "/kubepods/besteffort/poduid-1/ctr-1"


async def test_update_is_rewritten_by_pre_update(connect, sock_dir, hook_dir) -> None:
    script = {"PreUpdateContainerResources": {"container_resources": {"cpu_quota": 30000}}}
    async with hook_server(sock_dir, "upd", script) as hook:
        hook.register(hook_dir, ["PreUpdateContainerResources"])
        _, link = await connect([pod()], [container()])
        wanted = nri.LinuxResources(cpu=nri.LinuxCPU(quota=nri.OptionalInt64(value=50000)))
        answer = await link.call(
            "UpdateContainer",
            nri.UpdateContainerRequest(pod=pod(), container=container(), linux_resources=wanted),
            nri.UpdateContainerResponse,
        )
    [update] = answer.update
    assert update.container_id == "ctr-1"
    assert update.linux.resources.cpu.quota.value == 30000
    seen = hook.requests("PreUpdateContainerResources")[0]
    assert seen["container_resources"]["cpu_quota"] == "50000"
    assert seen["pod_labels"] == {"app": "web"}  # from Synchronize


async def test_every_event_reaches_its_hook_with_pod_data(connect, sock_dir, hook_dir, caplog) -> None:
    hooks = ["PreRunPodSandbox", "PreStartContainer", "PostStartContainer", "PostStopContainer", "PostStopPodSandbox"]
    script = {"PreRunPodSandbox": {"labels": {"new": "label"}}, "PreStartContainer": {"container_envs": {"A": "b"}}}
    caplog.set_level(logging.WARNING, logger="runtimeproxy.nri")
    async with hook_server(sock_dir, "all", script) as hook:
        hook.register(hook_dir, hooks)
        plugin, link = await connect()
        for attempt in range(2):  # the dropped answers are logged once per server
            await link.state_change(E.RUN_POD_SANDBOX, pod(f"pod-{attempt}", uid=f"uid-{attempt}"))
        p = pod("pod-1", uid="uid-1")
        c = container("ctr-9", "pod-1", uid="uid-1")
        await link.create_container(p, c)
        await link.state_change(E.START_CONTAINER, p, c)
        assert not hook.requests("PostStartContainer")  # not before the runtime says it runs
        running = nri.Container()
        running.CopyFrom(c)
        running.state, running.pid = nri.CONTAINER_RUNNING, 4242
        await link.state_change(E.POST_START_CONTAINER, p, running)
        await link.call("StopContainer", nri.StopContainerRequest(pod=p, container=c), nri.StopContainerResponse)
        await link.state_change(E.STOP_POD_SANDBOX, p)
        await plugin.stage.drain()  # post hooks run in the background, in order
        await link.state_change(E.REMOVE_CONTAINER, p, c)
        await link.state_change(E.REMOVE_POD_SANDBOX, p)
        records = hook.records()
    assert [r["hook"] for r in records] == [
        "PreRunPodSandbox", "PreRunPodSandbox", "PreStartContainer", "PostStartContainer",
        "PostStopContainer", "PostStopPodSandbox",
    ]
    run_pod = records[0]["request"]
    assert run_pod["pod_meta"]["uid"] == "uid-0" and run_pod["labels"] == {"app": "web"}
    assert run_pod["cgroup_parent"] == "/kubepods/burstable/poduid-0" and run_pod["runtime_handler"] == "runc"
    for record in records[2:5]:
        request = record["request"]
        assert request["container_meta"]["id"] == "ctr-9"
        assert request["pod_labels"] == {"app": "web"} and request["pod_annotations"] == {"pod-note": "x"}
        assert request["pod_cgroup_parent"] == "/kubepods/burstable/poduid-1"
    assert records[5]["request"]["pod_meta"]["uid"] == "uid-1"
    assert "ctr-9" not in plugin.store.containers and "pod-1" not in plugin.store.pods
    dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert sorted((r.hook, r.dropped) for r in dropped) == [
        ("PreRunPodSandbox", "labels"), ("PreStartContainer", "container_envs")
    ]


async def test_containers_from_before_the_plugin_get_full_pod_data(connect, sock_dir, hook_dir) -> None:
    async with hook_server(sock_dir, "start", {}) as hook:
        hook.register(hook_dir, ["PreStartContainer"])
        _, link = await connect([pod()], [container()])
        # containerd sends the container with a bare pod (as for any event);
        # the pod data comes from Synchronize.
        await link.state_change(E.START_CONTAINER, nri.PodSandbox(id="pod-1"), container())
        seen = hook.requests("PreStartContainer")[0]
    assert seen["pod_labels"] == {"app": "web"} and seen["pod_meta"]["name"] == "web"


async def test_skip_label_skips_hooks(connect, sock_dir, hook_dir) -> None:
    async with hook_server(sock_dir, "quota", QUOTA_HOOK) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        skipped = pod(**{"runtimeproxy.koordinator.sh/skip-hookserver": "true"})
        _, link = await connect([skipped])
        answer = await link.create_container(skipped, container())
        assert hook.requests() == []
    assert answer.adjust == nri.ContainerAdjustment()


async def test_chained_servers_apply_in_order(connect, sock_dir, hook_dir) -> None:
    first = {"PreCreateContainer": {"container_resources": {"cpu_quota": 10000}, "container_envs": {"X": "first"}}}
    second = {"PreCreateContainer": {"container_envs": {"X": "second"}}}
    async with hook_server(sock_dir, "a", first) as a, hook_server(sock_dir, "b", second) as b:
        a.register(hook_dir, ["PreCreateContainer"], priority=1)
        b.register(hook_dir, ["PreCreateContainer"], priority=2)
        _, link = await connect([pod()])
        answer = await link.create_container(pod(), container())
        seen_by_second = b.requests("PreCreateContainer")[0]
    assert [(kv.key, kv.value) for kv in answer.adjust.env] == [("X", "second")]
    assert answer.adjust.linux.resources.cpu.quota.value == 10000
    assert seen_by_second["container_envs"]["X"] == "first"  # the chain: b saw a's answer
