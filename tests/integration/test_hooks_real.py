"""Issue 4 with real parts: containerd 1.6 + runc, hook-server processes, and
the effects read where they land (cgroup files, the container's env)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import grpc
import pytest
from grpc import aio

from runtimeproxy.host.crispec import container_config, pod_sandbox_config

from ..filewatch import until_on_disk
from ..hookprocs import hook_server, registered
from .crihelpers import V1, V1ALPHA2, CriApi, cgroup_of, verbose_info
from .proxyfixtures import ProxyLauncher
from .test_localruntime import remove_pod_quietly

MIB = 1024 * 1024


def cgroup_value(pid: int, controller: str, name: str) -> int:
    return int((cgroup_of(pid, controller) / name).read_text())


async def container_pid(api: CriApi, channel: aio.Channel, cid: str) -> int:
    status = await api.runtime(channel).ContainerStatus(api.pb.ContainerStatusRequest(container_id=cid, verbose=True), timeout=10)
    return int(verbose_info(status)["pid"])


async def run_container(
    api: CriApi, channel: aio.Channel, log_dir: Path, command: tuple[str, ...] | None = None, **pod_labels: str
) -> tuple[str, str]:
    rt, pb = api.runtime(channel), api.pb
    pod_config = pod_sandbox_config(pb, log_dir, labels=pod_labels)
    pod_id = (await rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_config), timeout=60)).pod_sandbox_id
    config = container_config(pb) if command is None else container_config(pb, command=command)
    config.envs.add(key="FROM_KUBELET", value=b"yes" if api is V1 else "yes")
    cid = (await rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config), timeout=60)).container_id
    await rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
    return pod_id, cid


@pytest.fixture
def hooks_dir(launcher: ProxyLauncher) -> Path:
    return launcher.dir


@pytest.mark.parametrize("api", [V1, V1ALPHA2], ids=lambda a: a.version)
async def test_quota_and_memory_land_in_cgroups_and_update_changes_them(cri_channel, launcher, hooks_dir, pod_log_dir, api) -> None:
    config = {
        "PreCreateContainer": {"container_resources": {"cpu_period": 100000, "cpu_quota": 20000, "memory_limit_in_bytes": 64 * MIB}},
        "PreUpdateContainerResources": {"container_resources": {"cpu_quota": 30000, "memory_limit_in_bytes": 96 * MIB}},
    }
    running, _ = await launcher.start()
    async with hook_server(hooks_dir, "quota", config) as hook, launcher.channel() as channel:
        hook.register(launcher.hook_dir, ["PreCreateContainer", "PreUpdateContainerResources"])
        await registered(running, 1)
        pod_id, cid = await run_container(api, channel, pod_log_dir)
        try:
            pid = await container_pid(api, channel, cid)
            assert cgroup_value(pid, "cpu", "cpu.cfs_period_us") == 100000
            assert cgroup_value(pid, "cpu", "cpu.cfs_quota_us") == 20000
            assert cgroup_value(pid, "memory", "memory.limit_in_bytes") == 64 * MIB

            # kubelet asks for 50000 and 128 MiB; the hook says 30000 and 96 MiB.
            pb = api.pb
            await api.runtime(channel).UpdateContainerResources(
                pb.UpdateContainerResourcesRequest(
                    container_id=cid, linux=pb.LinuxContainerResources(cpu_period=100000, cpu_quota=50000, memory_limit_in_bytes=128 * MIB)
                ),
                timeout=30,
            )
            assert cgroup_value(pid, "cpu", "cpu.cfs_quota_us") == 30000
            assert cgroup_value(pid, "memory", "memory.limit_in_bytes") == 96 * MIB
            seen = hook.requests("PreUpdateContainerResources")[0]
            assert seen["container_resources"]["cpu_quota"] == "50000"
            assert seen["container_meta"]["id"] == cid
        finally:
            await remove_pod_quietly(V1, cri_channel, pod_id)


async def appears(path: Path, timeout: float = 15.0) -> None:
    """Until ``path`` exists (file events on its directory, no polling)."""
    await until_on_disk(path.parent, path.exists, f"{path} made", timeout)


async def test_update_lands_while_a_stop_waits_out_its_grace_period(cri_channel, launcher, hooks_dir, pod_log_dir) -> None:
    """kubelet's CPU manager updates a container that is being stopped: the update (with its
    hook) reaches the cgroup at once, not after the grace period."""
    grace = 20  # the update's bound is half of it: through proxy, hook and containerd on a loaded machine
    marker = "/tmp/term-seen"
    # PID 1 notes SIGTERM and carries on, so the stop takes its whole grace period.
    command = ("/bin/sh", "-c", f"trap 'touch {marker}' TERM; while :; do sleep 0.1; done")
    running, _ = await launcher.start()
    config = {"PreUpdateContainerResources": {"container_resources": {"cpu_quota": 30000}}}
    async with hook_server(hooks_dir, "update", config) as hook, launcher.channel() as channel:
        hook.register(launcher.hook_dir, ["PreUpdateContainerResources"])
        await registered(running, 1)
        pod_id, cid = await run_container(V1, channel, pod_log_dir, command=command)
        rt, pb = V1.runtime(channel), V1.pb
        try:
            pid = await container_pid(V1, channel, cid)
            stop = asyncio.ensure_future(rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=grace), timeout=60))
            await appears(Path(f"/proc/{pid}/root{marker}"))  # containerd is now waiting out the grace period
            started = time.monotonic()
            await rt.UpdateContainerResources(
                pb.UpdateContainerResourcesRequest(container_id=cid, linux=pb.LinuxContainerResources(cpu_period=100000, cpu_quota=50000)),
                timeout=30,
            )
            assert time.monotonic() - started < grace / 2
            assert not stop.done()
            assert cgroup_value(pid, "cpu", "cpu.cfs_quota_us") == 30000
            assert hook.requests("PreUpdateContainerResources")[0]["container_meta"]["id"] == cid
            await asyncio.wait_for(stop, 60)
            status = await rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=10)
            assert status.status.state == pb.CONTAINER_EXITED
        finally:
            await remove_pod_quietly(V1, cri_channel, pod_id)


async def test_chained_hooks_env_annotations_labels(cri_channel, launcher, hooks_dir, pod_log_dir) -> None:
    first = {
        "PreRunPodSandbox": {"labels": {"qos.example/class": "be"}, "annotations": {"hooked-pod": "first"}},
        "PreCreateContainer": {
            "container_resources": {"cpu_period": 100000, "cpu_quota": 20000},
            "container_annotations": {"hooked-by": "first"},
            "container_envs": {"HOOK_ORDER": "first", "FIRST_ONLY": "1"},
        },
    }
    second = {
        "PreCreateContainer": {
            "container_resources": {"memory_limit_in_bytes": 64 * MIB},
            "container_annotations": {"hooked-by": "second"},
            "container_envs": {"HOOK_ORDER": "second"},
        },
    }
    running, _ = await launcher.start()
    async with (
        hook_server(hooks_dir, "zz-first", first) as a,
        hook_server(hooks_dir, "aa-second", second) as b,
        launcher.channel() as channel,
    ):
        a.register(launcher.hook_dir, ["PreRunPodSandbox", "PreCreateContainer"], priority=1)
        b.register(launcher.hook_dir, ["PreCreateContainer"], priority=2)
        await registered(running, 2)
        pod_id, cid = await run_container(V1, channel, pod_log_dir)
        try:
            rt, pb = V1.runtime(channel), V1.pb
            pod = await rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id), timeout=10)
            assert pod.status.labels["qos.example/class"] == "be"
            assert pod.status.annotations["hooked-pod"] == "first"
            # The second hook saw the first one's changes.
            seen = b.requests("PreCreateContainer")[0]
            assert seen["container_resources"]["cpu_quota"] == "20000"
            assert seen["container_envs"]["HOOK_ORDER"] == "first"
            assert seen["pod_labels"]["qos.example/class"] == "be"

            pid = await container_pid(V1, channel, cid)
            assert cgroup_value(pid, "cpu", "cpu.cfs_quota_us") == 20000
            assert cgroup_value(pid, "memory", "memory.limit_in_bytes") == 64 * MIB
            env = await rt.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=["env"], timeout=10), timeout=20)
            lines = set(env.stdout.decode().splitlines())
            assert {"HOOK_ORDER=second", "FIRST_ONLY=1", "FROM_KUBELET=yes"} <= lines
            status = await rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=10)
            assert status.status.annotations["hooked-by"] == "second"
        finally:
            await remove_pod_quietly(V1, cri_channel, pod_id)


@pytest.mark.parametrize(("fault", "policy"), [("hang", "Fail"), ("crash", "Ignore"), ("absent", "Fail"), ("error", "Ignore")])
async def test_failure_policies_with_real_runtime(cri_channel, launcher, hooks_dir, pod_log_dir, fault, policy) -> None:
    behaviours = {"hang": "hang", "crash": {"behaviour": "crash"}, "error": {"behaviour": "error", "message": "nope"}}
    running, _ = await launcher.start()
    timeout_s = 0.8
    async with contextlib.AsyncExitStack() as stack:
        if fault == "absent":
            from hooks.sdk import write_hook_config

            write_hook_config(launcher.hook_dir, "absent", hooks_dir / "absent.sock", ["PreCreateContainer"], policy, timeout_s)
        else:
            hook = await stack.enter_async_context(hook_server(hooks_dir, "faulty", {"PreCreateContainer": behaviours[fault]}))
            hook.register(launcher.hook_dir, ["PreCreateContainer"], policy, timeout=f"{int(timeout_s * 1000)}ms")
        await registered(running, 1)
        channel = await stack.enter_async_context(launcher.channel())
        rt, pb = V1.runtime(channel), V1.pb
        pod_config = pod_sandbox_config(pb, pod_log_dir)
        pod_id = (await rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_config), timeout=60)).pod_sandbox_id
        stack.push_async_callback(remove_pod_quietly, V1, cri_channel, pod_id)
        request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config(pb), sandbox_config=pod_config)
        started = time.monotonic()
        if policy == "Fail":
            with pytest.raises(aio.AioRpcError) as err:
                await rt.CreateContainer(request, timeout=30)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "PreCreateContainer" in err.value.details()
            elapsed = time.monotonic() - started
            listed = await V1.runtime(cri_channel).ListContainers(pb.ListContainersRequest(filter=pb.ContainerFilter(pod_sandbox_id=pod_id)), timeout=10)
            assert list(listed.containers) == []  # containerd was never asked
        else:
            cid = (await rt.CreateContainer(request, timeout=30)).container_id
            elapsed = time.monotonic() - started
            await rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
            assert cgroup_value(await container_pid(V1, channel, cid), "cpu", "cpu.cfs_quota_us") == -1  # unmodified
        # Well under the call's 30 s deadline, which a hang the hook's timeout
        # did not end would run to; room for containerd's own CreateContainer.
        assert elapsed < timeout_s + 8, f"{fault}/{policy}: {elapsed:.2f}s"


async def test_state_survives_proxy_restart(cri_channel, launcher, hooks_dir, pod_log_dir) -> None:
    """The next hook after a restart gets the same pod data as before it,
    also for a container created while the proxy was down."""
    update = V1.pb.UpdateContainerResourcesRequest(linux=V1.pb.LinuxContainerResources(cpu_period=100000, cpu_quota=40000))
    pod_fields = ("pod_meta", "pod_labels", "pod_annotations", "pod_cgroup_parent", "pod_resources")
    config = {"PreCreateContainer": {"container_annotations": {"created-through": "proxy"}}}
    async with hook_server(hooks_dir, "recorder", config) as hook:
        hook.register(launcher.hook_dir, ["PreCreateContainer", "PreUpdateContainerResources", "PostStopContainer"])
        first, first_stack = await launcher.start()
        await registered(first, 1)
        async with launcher.channel() as channel:
            pod_id, cid = await run_container(V1, channel, pod_log_dir, team="storage")
            try:
                update.container_id = cid
                await V1.runtime(channel).UpdateContainerResources(update, timeout=30)
                before = hook.requests("PreUpdateContainerResources")[-1]
                await first_stack.aclose()  # proxy down

                # While the proxy is down, kubelet's twin creates another container directly.
                pb = V1.pb
                pod = await V1.runtime(cri_channel).PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True), timeout=10)
                sandbox_config = pb.PodSandboxConfig()
                from google.protobuf import json_format

                json_format.ParseDict(verbose_info(pod)["config"], sandbox_config, ignore_unknown_fields=True)
                other = (await V1.runtime(cri_channel).CreateContainer(
                    pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config(pb, name="direct"), sandbox_config=sandbox_config), timeout=60
                )).container_id

                second, _ = await launcher.start()
                await registered(second, 1)
                async with launcher.channel() as channel2:
                    await V1.runtime(channel2).UpdateContainerResources(update, timeout=30)
                    after = hook.requests("PreUpdateContainerResources")[-1]
                    assert after == before
                    assert after["pod_labels"]["team"] == "storage"
                    assert after["container_annotations"]["created-through"] == "proxy"
                    update.container_id = other
                    await V1.runtime(channel2).UpdateContainerResources(update, timeout=30)
                    direct = hook.requests("PreUpdateContainerResources")[-1]
                    assert {k: direct.get(k) for k in pod_fields} == {k: before.get(k) for k in pod_fields}
                    assert direct["container_meta"] == {"name": "direct", "id": other}
                    # Resources as the last update left them, not as created.
                    await V1.runtime(channel2).StopContainer(pb.StopContainerRequest(container_id=cid, timeout=10), timeout=30)
                    await second.hooks.drain()
                    stopped = hook.requests("PostStopContainer")[-1]
                    assert stopped["container_meta"]["id"] == cid
                    assert stopped["container_resources"]["cpu_quota"] == "40000"
                    assert {k: stopped.get(k) for k in pod_fields} == {k: before.get(k) for k in pod_fields}
            finally:
                await remove_pod_quietly(V1, cri_channel, pod_id)
