"""batchresource's reconcile pass puts back a BE container's value that another
writer changed: real containerd, values read and written where they land, in
/sys/fs/cgroup."""

from __future__ import annotations

import contextlib

from hooks.batchresource.reconcile import CONTAINER_RESTORED

from ..hookprocs import registered
from .batchhelpers import batchresource_hook
from .crihelpers import V1, cgroup_of
from .proxyfixtures import ProxyLauncher
from .test_batchresource import BE, MIB, batch, container_values, pod, spec, start_container

BE_VALUES = (512, 50000, 128 * MIB)


async def test_a_be_container_value_changed_by_hand_is_put_back(cri_channel, launcher: ProxyLauncher, pod_log_dir) -> None:
    # The listing (through the proxy) tells the reconcile pass the container's id.
    running, _ = await launcher.start()  # (first: the hook lists pods through it)
    async with batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms",
                                  runtime_endpoint=str(launcher.socket)) as hook:
        await registered(running, 1)
        async with launcher.channel() as channel, pod(channel, cri_channel, pod_log_dir, BE, spec(main=batch("500", "128Mi"))) as p:
            cid, pid = await start_container(channel, p, "main")
            assert container_values(pid) == BE_VALUES
            (cgroup_of(pid, "cpu") / "cpu.cfs_quota_us").write_text("-1")
            (cgroup_of(pid, "cpu") / "cpu.shares").write_text("4096")
            (cgroup_of(pid, "memory") / "memory.limit_in_bytes").write_text(str(96 * MIB))  # (below the swap limit runc set to 128Mi)
            pod_name = f"{p.config.metadata.namespace}/{p.config.metadata.name}"
            for file, found, wanted in (("cpu.cfs_quota_us", -1, 50000), ("cpu.shares", 4096, 512),
                                        ("memory.limit_in_bytes", 96 * MIB, 128 * MIB)):
                line = await hook.logged(lambda line, f=file: line.get("msg") == CONTAINER_RESTORED and line.get("pod") == pod_name
                                         and line.get("file") == f, timeout=20.0)
                assert (line["container"], line["container_id"], line["found"], line["wanted"]) == ("main", cid, found, wanted)
            assert container_values(pid) == BE_VALUES


async def test_a_be_container_updated_through_containerd_itself_is_put_back(
    cri_channel, launcher: ProxyLauncher, pod_log_dir
) -> None:
    """An UpdateContainerResources sent to containerd's own socket (crictl
    update), not through the proxy: containerd sets the v1 memory+swap limit
    to the memory limit too (96Mi both), so the memory limit is put back
    memsw first (before: memory.limit_in_bytes alone, above memsw, refused
    EINVAL every pass). The update is sent while the hook is down: a pass
    between runc's writes of it would see it half made."""
    running, _ = await launcher.start()
    async with contextlib.AsyncExitStack() as first_hook, launcher.channel() as channel:
        await first_hook.enter_async_context(batchresource_hook(
            launcher.dir, launcher.hook_dir, reconcile_interval="200ms", runtime_endpoint=str(launcher.socket)))
        await registered(running, 1)
        async with pod(channel, cri_channel, pod_log_dir, BE, spec(main=batch("500", "128Mi"))) as p:
            cid, pid = await start_container(channel, p, "main")
            await first_hook.aclose()
            memsw = cgroup_of(pid, "memory") / "memory.memsw.limit_in_bytes"
            assert container_values(pid) == BE_VALUES
            assert int(memsw.read_text()) == 128 * MIB  # as containerd made it: equal to the memory limit (no swap)
            pb = V1.pb
            update = pb.LinuxContainerResources(cpu_shares=1024, cpu_period=100000, cpu_quota=20000,
                                                memory_limit_in_bytes=96 * MIB)
            await V1.runtime(cri_channel).UpdateContainerResources(
                pb.UpdateContainerResourcesRequest(container_id=cid, linux=update), timeout=30)
            assert int(memsw.read_text()) == 96 * MIB  # (what the put back must get past)
            # Started again, with the pod saved in its state dir: the listing gives the container's id.
            async with batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms",
                                          runtime_endpoint=str(launcher.socket)) as hook:
                pod_name = f"{p.config.metadata.namespace}/{p.config.metadata.name}"
                for file, found, wanted in (("cpu.shares", 1024, 512), ("cpu.cfs_quota_us", 20000, 50000),
                                            ("memory.limit_in_bytes", 96 * MIB, 128 * MIB)):
                    line = await hook.logged(lambda line, f=file: line.get("msg") == CONTAINER_RESTORED and line.get("pod") == pod_name
                                             and line.get("file") == f, timeout=20.0)
                    assert (line["container_id"], line["found"], line["wanted"]) == (cid, found, wanted)
                assert container_values(pid) == BE_VALUES
                assert int(memsw.read_text()) == 128 * MIB
                assert not [line for line in hook.lines if "could not restore a container cgroup" in line.get("msg", "")]


async def test_a_be_container_memsw_changed_alone_is_put_back(cri_channel, launcher: ProxyLauncher, pod_log_dir) -> None:
    """Swap given to a BE container by hand (memory.memsw.limit_in_bytes to
    1Gi), its memory limit right: put back equal to it, as containerd made it
    (before: memsw not compared, the container kept its swap)."""
    running, _ = await launcher.start()  # (first: the hook lists pods through it)
    async with batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms",
                                  runtime_endpoint=str(launcher.socket)) as hook:
        await registered(running, 1)
        async with launcher.channel() as channel, pod(channel, cri_channel, pod_log_dir, BE, spec(main=batch("500", "128Mi"))) as p:
            cid, pid = await start_container(channel, p, "main")
            memsw = cgroup_of(pid, "memory") / "memory.memsw.limit_in_bytes"
            assert container_values(pid) == BE_VALUES and int(memsw.read_text()) == 128 * MIB
            memsw.write_text(str(1024 * MIB))
            pod_name = f"{p.config.metadata.namespace}/{p.config.metadata.name}"
            line = await hook.logged(lambda line: line.get("msg") == CONTAINER_RESTORED and line.get("pod") == pod_name
                                     and line.get("file") == "memory.memsw.limit_in_bytes", timeout=20.0)
            assert (line["container_id"], line["field"], line["found"], line["wanted"]) == (
                cid, "memory_swap", 1024 * MIB, 128 * MIB)
            assert int(memsw.read_text()) == 128 * MIB and container_values(pid) == BE_VALUES


async def test_a_be_container_period_changed_by_hand_is_put_back_under_its_pod(
    cri_channel, launcher: ProxyLauncher, pod_log_dir
) -> None:
    """The container's 0.5 cpu as 100000/200000 by hand, under its pod's
    50000/100000: put back at 50000/100000, the quota first, as the real
    kernel refuses the period first (100000/100000, above the pod) (before:
    refused EINVAL every pass). Changed while the hook is down: a pass
    that read between the two writes (50000/200000) would put both back,
    logged under the period's file."""
    running, _ = await launcher.start()
    async with contextlib.AsyncExitStack() as first_hook, launcher.channel() as channel:
        await first_hook.enter_async_context(batchresource_hook(
            launcher.dir, launcher.hook_dir, reconcile_interval="200ms", runtime_endpoint=str(launcher.socket)))
        await registered(running, 1)
        async with pod(channel, cri_channel, pod_log_dir, BE, spec(main=batch("500", "128Mi"))) as p:
            cid, pid = await start_container(channel, p, "main")
            await first_hook.aclose()
            cpu = cgroup_of(pid, "cpu")
            assert container_values(pid) == BE_VALUES
            assert int((cpu.parent / "cpu.cfs_quota_us").read_text()) == 50000  # the pod's: the bound
            (cpu / "cpu.cfs_period_us").write_text("200000")  # (in the order the kernel takes)
            (cpu / "cpu.cfs_quota_us").write_text("100000")
            # Started again, with the pod saved in its state dir: the listing gives the container's id.
            async with batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms",
                                          runtime_endpoint=str(launcher.socket)) as hook:
                pod_name = f"{p.config.metadata.namespace}/{p.config.metadata.name}"
                line = await hook.logged(lambda line: line.get("msg") == CONTAINER_RESTORED and line.get("pod") == pod_name
                                         and line.get("file") == "cpu.cfs_quota_us", timeout=20.0)
                assert (line["container_id"], line["found"], line["wanted"]) == (cid, 100000, 50000)
                assert (int((cpu / "cpu.cfs_period_us").read_text()), container_values(pid)) == (100000, BE_VALUES)
                assert not [line for line in hook.lines if "could not restore a container cgroup" in line.get("msg", "")]
