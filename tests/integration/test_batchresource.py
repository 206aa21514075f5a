"""Issue 9 end to end: ``runtime-proxy hook run batchresource`` (a process) behind the
proxy in front of the real containerd; values read where they land, in /sys/fs/cgroup."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from grpc import aio

from runtimeproxy.host.crispec import container_config, pod_sandbox_config

from ..hookprocs import registered
from .batchhelpers import HookRun, PodCgroup, batchresource_hook
from .crihelpers import V1, cgroup_of
from .proxyfixtures import ProxyLauncher
from .test_hooks_real import container_pid
from .test_localruntime import remove_pod_quietly

MIB = 2**20
SPEC = "node.koordinator.sh/extended-resource-spec"
BE = {"koordinator.sh/qosClass": "BE"}
UNLIMITED_MEMORY = 2**62  # v1 shows "no limit" as a huge page-aligned number


def batch(cpu: str, memory: str) -> dict:
    both = {"kubernetes.io/batch-cpu": cpu, "kubernetes.io/batch-memory": memory}
    return {"requests": both, "limits": both}


def spec(**containers: dict) -> dict[str, str]:
    return {SPEC: json.dumps({"containers": containers})}


@dataclass
class Pod:
    id: str
    config: object
    cgroup: PodCgroup


@contextlib.asynccontextmanager
async def pod(channel: aio.Channel, cri_channel: aio.Channel, log_dir: Path, labels: dict, annotations: dict) -> AsyncIterator[Pod]:
    """A pod run through ``channel`` with its pod cgroup made first, as kubelet does."""
    pb = V1.pb
    config = pod_sandbox_config(pb, log_dir, name="batch", labels=labels, annotations=annotations)
    cgroup = PodCgroup.new(config.metadata.uid)
    config.linux.cgroup_parent = cgroup.parent
    cgroup.make()
    pod_id = ""
    try:
        pod_id = (await V1.runtime(channel).RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60)).pod_sandbox_id
        yield Pod(pod_id, config, cgroup)
    finally:
        if pod_id:
            await remove_pod_quietly(V1, cri_channel, pod_id)
        await cgroup.remove()


async def start_container(channel: aio.Channel, p: Pod, name: str, sandbox_config: object | None = None) -> tuple[str, int]:
    rt, pb = V1.runtime(channel), V1.pb
    request = pb.CreateContainerRequest(pod_sandbox_id=p.id, config=container_config(pb, name=name), sandbox_config=sandbox_config or p.config)
    cid = (await rt.CreateContainer(request, timeout=60)).container_id
    await rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
    return cid, await container_pid(V1, channel, cid)


def container_values(pid: int) -> tuple[int, int, int]:
    return (
        int((cgroup_of(pid, "cpu") / "cpu.shares").read_text()),
        int((cgroup_of(pid, "cpu") / "cpu.cfs_quota_us").read_text()),
        int((cgroup_of(pid, "memory") / "memory.limit_in_bytes").read_text()),
    )


def pod_values(cgroup: PodCgroup) -> tuple[int, int, int]:
    return (cgroup.value("cpu", "cpu.shares"), cgroup.value("cpu", "cpu.cfs_quota_us"), cgroup.value("memory", "memory.limit_in_bytes"))


@pytest.fixture
async def hook(launcher: ProxyLauncher) -> AsyncIterator[HookRun]:
    async with batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms") as run:
        yield run


async def test_one_container_be_pod(cri_channel, launcher, hook, pod_log_dir) -> None:
    running, _ = await launcher.start()
    await registered(running, 1)
    async with launcher.channel() as channel, pod(channel, cri_channel, pod_log_dir, BE, spec(main=batch("500", "128Mi"))) as p:
        assert pod_values(p.cgroup) == (512, 50000, 128 * MIB)
        _, pid = await start_container(channel, p, "main")
        assert cgroup_of(pid, "cpu").parent == p.cgroup.path("cpu")
        assert container_values(pid) == (512, 50000, 134217728)
        assert pod_values(p.cgroup) == (512, 50000, 134217728)


async def test_two_container_be_pod_gets_the_sums(cri_channel, launcher, hook, pod_log_dir) -> None:
    running, _ = await launcher.start()
    await registered(running, 1)
    annotations = spec(main=batch("500", "128Mi"), side=batch("250", "64Mi"))
    async with launcher.channel() as channel, pod(channel, cri_channel, pod_log_dir, BE, annotations) as p:
        assert pod_values(p.cgroup) == (768, 75000, 192 * MIB)
        _, main = await start_container(channel, p, "main")
        _, side = await start_container(channel, p, "side")
        assert container_values(main) == (512, 50000, 128 * MIB)
        assert container_values(side) == (256, 25000, 64 * MIB)
        assert pod_values(p.cgroup) == (768, 75000, 192 * MIB)


async def test_non_be_pod_is_untouched(cri_channel, launcher, hook, pod_log_dir) -> None:
    running, _ = await launcher.start()
    await registered(running, 1)
    labels = {"koordinator.sh/qosClass": "LS"}
    async with launcher.channel() as channel, pod(channel, cri_channel, pod_log_dir, labels, spec(main=batch("500", "128Mi"))) as p:
        _, pid = await start_container(channel, p, "main")
        shares, quota, memory = container_values(pid)
        assert (shares, quota) == (1024, -1) and memory > UNLIMITED_MEMORY
        shares, quota, memory = pod_values(p.cgroup)
        assert (shares, quota) == (1024, -1) and memory > UNLIMITED_MEMORY


async def test_update_reapplies_the_batch_values(cri_channel, launcher, hook, pod_log_dir) -> None:
    running, _ = await launcher.start()
    await registered(running, 1)
    async with launcher.channel() as channel, pod(channel, cri_channel, pod_log_dir, BE, spec(main=batch("500", "128Mi"))) as p:
        cid, pid = await start_container(channel, p, "main")
        pb = V1.pb
        # What kubelet would send for a BE container (no native resources), then something else.
        kubelet = pb.LinuxContainerResources(cpu_period=100000, cpu_quota=30000, cpu_shares=2, memory_limit_in_bytes=64 * MIB)
        await V1.runtime(channel).UpdateContainerResources(pb.UpdateContainerResourcesRequest(container_id=cid, linux=kubelet), timeout=30)
        assert container_values(pid) == (512, 50000, 128 * MIB)
        # (Logged before the answer; read from the hook's stderr by a task of the test's.)
        await hook.logged(lambda line: line.get("hook") == "PreUpdateContainerResources" and line.get("container") == "main")


async def test_reconcile_restores_a_pod_value_changed_by_hand(cri_channel, launcher, hook, pod_log_dir) -> None:
    running, _ = await launcher.start()
    await registered(running, 1)
    async with launcher.channel() as channel, pod(channel, cri_channel, pod_log_dir, BE, spec(main=batch("500", "128Mi"))) as p:
        await start_container(channel, p, "main")
        p.cgroup.write("cpu", "cpu.cfs_quota_us", 200000)
        p.cgroup.write("cpu", "cpu.shares", 4096)
        pod_name = f"{p.config.metadata.namespace}/{p.config.metadata.name}"
        for field, found in (("cpu_quota", 200000), ("cpu_shares", 4096)):
            line = await hook.logged(lambda line, f=field: line.get("msg") == "batchresource reconcile restored a pod cgroup value"
                                     and line.get("pod") == pod_name and line.get("field") == f)
            assert (line["found"], line["restored"]) == (found, {"cpu_quota": 50000, "cpu_shares": 512}[field])
        assert pod_values(p.cgroup) == (512, 50000, 128 * MIB)


async def test_malformed_annotation_leaves_the_pod_running_unchanged(cri_channel, launcher, hook, pod_log_dir) -> None:
    running, _ = await launcher.start()
    await registered(running, 1)
    bad = spec(main={"limits": {"kubernetes.io/batch-cpu": "lots"}})
    async with launcher.channel() as channel, pod(channel, cri_channel, pod_log_dir, BE, bad) as p:
        cid, pid = await start_container(channel, p, "main")
        status = await V1.runtime(channel).ContainerStatus(V1.pb.ContainerStatusRequest(container_id=cid), timeout=10)
        assert status.status.state == V1.pb.CONTAINER_RUNNING
        shares, quota, memory = container_values(pid)
        assert (shares, quota) == (1024, -1) and memory > UNLIMITED_MEMORY
        shares, quota, memory = pod_values(p.cgroup)
        assert (shares, quota) == (1024, -1) and memory > UNLIMITED_MEMORY
        pod_name = f"{p.config.metadata.namespace}/{p.config.metadata.name}"
        for point in ("PreRunPodSandbox", "PreCreateContainer"):  # (logged before the answers; read by a task)
            await hook.logged(lambda line, h=point: line.get("level") == "warning" and line.get("pod") == pod_name
                              and line.get("hook") == h)
        warnings = [line for line in hook.lines if line.get("level") == "warning" and line.get("pod") == pod_name]
        assert {line["hook"] for line in warnings} == {"PreRunPodSandbox", "PreCreateContainer"}
        assert all("'lots' is not a quantity" in line["reason"] for line in warnings)


async def test_proxy_restart_between_run_pod_sandbox_and_create_container(cri_channel, launcher, hook, pod_log_dir) -> None:
    first, first_stack = await launcher.start()
    await registered(first, 1)
    async with launcher.channel() as channel, pod(channel, cri_channel, pod_log_dir, BE, spec(main=batch("500", "128Mi"))) as p:
        await channel.close()
        await first_stack.aclose()  # proxy down after RunPodSandbox
        second, _ = await launcher.start()
        await registered(second, 1)
        # A sandbox config without the BE label and the spec: what the hook sees can only
        # come from the pod the restarted proxy rebuilt from containerd.
        bare = V1.pb.PodSandboxConfig()
        bare.CopyFrom(p.config)
        bare.labels.clear()
        bare.annotations.clear()
        async with launcher.channel() as channel2:
            _, pid = await start_container(channel2, p, "main", sandbox_config=bare)
            assert container_values(pid) == (512, 50000, 128 * MIB)
