"""A hook pinning a container to a CPU its pod's cgroup parent lacks, with
containerd and runc on cgroup v1: the proxy refuses the answer by the hook's
failure policy, naming the parent, where runc would fail the container's
start (EACCES writing cpuset.cpus under a narrower parent)."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest
from grpc import aio

from runtimeproxy.hookpath.parentcpuset import ParentCpusets
from runtimeproxy.hookpath.validate import parse_id_list
from runtimeproxy.host.crispec import container_config, pod_sandbox_config

from ..hookprocs import hook_server, registered
from ..prerequisites import cgroup_v1_cpuset_mounted, fail_or_skip
from .batchhelpers import PodCgroup
from .crihelpers import V1, cgroup_of
from .test_hooks_real import container_pid
from .test_localruntime import remove_pod_quietly

ONLINE = sorted(parse_id_list(Path("/sys/devices/system/cpu/online").read_text()))


@pytest.fixture(autouse=True)
def legacy_cpuset_rule() -> None:
    """Two CPUs and cgroup v1's cpuset hierarchy (a skip elsewhere, a failure in CI)."""
    if len(ONLINE) < 2:
        fail_or_skip("needs two online CPUs")
    if not ParentCpusets.of_host().judged:
        mounted = cgroup_v1_cpuset_mounted()
        fail_or_skip("a cgroup v1 cpuset hierarchy is mounted, yet not found" if mounted
                     else "needs a cgroup v1 cpuset hierarchy (without cpuset_v2_mode)")


def refused_by_the_kernel(parent: Path, cpu: int) -> None:
    """The premise: under the narrowed parent the kernel refuses ``cpu`` with
    EACCES, as it refuses runc's write of the container's cpuset."""
    child = parent / f"rp-premise-{os.getpid()}"
    child.mkdir()
    try:
        with pytest.raises(PermissionError):
            (child / "cpuset.cpus").write_text(str(cpu))
    finally:
        child.rmdir()


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_a_cpu_outside_the_pods_parent_is_the_hooks_failure(cri_channel, launcher, pod_log_dir, policy: str) -> None:
    pb = V1.pb
    config = pod_sandbox_config(pb, pod_log_dir, name="narrow")
    pod = PodCgroup.new(config.metadata.uid)
    config.linux.cgroup_parent = pod.parent
    pod.make()  # as kubelet does before RunPodSandbox
    kept, outside = ONLINE[0], ONLINE[1]
    (pod.path("cpuset") / "cpuset.cpus").write_text(str(kept))  # a pod the CPU manager narrowed, say
    running, _ = await launcher.start()
    pod_id = ""
    try:
        refused_by_the_kernel(pod.path("cpuset"), outside)
        pin = {"PreCreateContainer": {"container_resources": {"cpuset_cpus": str(outside)}}}
        async with hook_server(launcher.dir, "pin", pin) as hook, launcher.channel() as channel:
            hook.register(launcher.hook_dir, ["PreCreateContainer"], policy)
            await registered(running, 1)
            rt = V1.runtime(channel)
            pod_id = (await rt.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60)).pod_sandbox_id
            create = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config(pb), sandbox_config=config)
            if policy == "Fail":
                with pytest.raises(aio.AioRpcError) as err:
                    await rt.CreateContainer(create, timeout=60)
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert (
                    f"cpuset_cpus '{outside}' names CPUs outside the parent cgroup {pod.parent} ({outside}; it has {kept})"
                    in err.value.details()
                )
                in_pod = pb.ContainerFilter(pod_sandbox_id=pod_id)
                listed = await rt.ListContainers(pb.ListContainersRequest(filter=in_pod), timeout=10)
                assert list(listed.containers) == []  # containerd was never asked
            else:
                cid = (await rt.CreateContainer(create, timeout=60)).container_id
                await rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
                pid = await container_pid(V1, channel, cid)
                assert cgroup_of(pid, "cpuset") == pod.path("cpuset") / cid
                assert (cgroup_of(pid, "cpuset") / "cpuset.cpus").read_text().strip() == str(kept)  # the parent's
                assert os.sched_getaffinity(pid) == {kept}
    finally:
        if pod_id:
            await remove_pod_quietly(V1, cri_channel, pod_id)
        await pod.remove()


async def test_a_pin_a_later_hooks_move_makes_fit_goes_on(cri_channel, launcher, pod_log_dir) -> None:
    """pin's CPU is outside the pod's parent, and iso then moves the container
    to a parent that has it: the chain's call is taken, and runc starts the
    container there (pin alone was refused, judged by the pod's parent)."""
    pb = V1.pb
    config = pod_sandbox_config(pb, pod_log_dir, name="moved")
    pod, iso = PodCgroup.new(config.metadata.uid), PodCgroup.new(f"{config.metadata.uid}-iso")
    config.linux.cgroup_parent = pod.parent
    kept, outside = ONLINE[0], ONLINE[1]
    for cgroup, cpu in ((pod, kept), (iso, outside)):
        cgroup.make()
        (cgroup.path("cpuset") / "cpuset.cpus").write_text(str(cpu))
    running, _ = await launcher.start()
    pod_id = ""
    try:
        pin = {"PreCreateContainer": {"container_resources": {"cpuset_cpus": str(outside)}}}
        move = {"PreCreateContainer": {"pod_cgroup_parent": iso.parent}}
        async with hook_server(launcher.dir, "pin", pin) as first, hook_server(launcher.dir, "iso", move) as second, \
                launcher.channel() as channel:
            first.register(launcher.hook_dir, ["PreCreateContainer"], "Fail", priority=1)
            second.register(launcher.hook_dir, ["PreCreateContainer"], "Fail", priority=2)
            await registered(running, 2)
            rt = V1.runtime(channel)
            pod_id = (await rt.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60)).pod_sandbox_id
            create = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config(pb), sandbox_config=config)
            cid = (await rt.CreateContainer(create, timeout=60)).container_id
            await rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
            pid = await container_pid(V1, channel, cid)
            assert cgroup_of(pid, "cpuset") == iso.path("cpuset") / cid
            assert os.sched_getaffinity(pid) == {outside}
    finally:
        if pod_id:
            await remove_pod_quietly(V1, cri_channel, pod_id)
        await pod.remove()
        await iso.remove()
