"""LocalContainerd against the real containerd, without the proxy in between."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import grpc
import pytest
from grpc import aio

from runtimeproxy.host.containerd import LocalContainerd, LocalRuntimeError
from runtimeproxy.host.crispec import container_config, pod_sandbox_config
from runtimeproxy.host.images import BUSYBOX_IMAGE, PAUSE_IMAGE
from runtimeproxy.host.process import mounts_under, run_command, shim_pids

from .crihelpers import APIS, V1, CriApi, cgroup_of, verbose_info
from .registry import LoopbackRegistry

pytestmark = pytest.mark.integration

api_params = pytest.mark.parametrize("api", APIS, ids=lambda a: a.version)


def process_alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (whoever reaps orphans may be slow)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def remove_pod_quietly(api: CriApi, channel: aio.Channel, pod_id: str) -> None:
    """Cleanup for failed tests; a pod the test already removed is fine."""
    rt = api.runtime(channel)
    for call, req in ((rt.StopPodSandbox, api.pb.StopPodSandboxRequest),
                      (rt.RemovePodSandbox, api.pb.RemovePodSandboxRequest)):
        try:
            await call(req(pod_sandbox_id=pod_id), timeout=30)
        except aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise


async def start_sleeper(api: CriApi, channel: aio.Channel, log_dir: Path,
                        image: str = BUSYBOX_IMAGE) -> tuple[str, str]:
    """Run a host-network pod with a running busybox container; returns (pod id, container id)."""
    rt, pb = api.runtime(channel), api.pb
    pod_config = pod_sandbox_config(pb, log_dir)
    pod_id = (await rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_config), timeout=60)).pod_sandbox_id
    created = await rt.CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=pod_id, config=container_config(pb, image=image), sandbox_config=pod_config),
        timeout=60)
    await rt.StartContainer(pb.StartContainerRequest(container_id=created.container_id), timeout=60)
    return pod_id, created.container_id


@api_params
async def test_version(cri_channel: aio.Channel, api: CriApi) -> None:
    response = await api.runtime(cri_channel).Version(api.pb.VersionRequest(version=api.version), timeout=10)
    assert response.runtime_api_version == api.version
    assert response.runtime_name == "containerd"
    assert response.runtime_version


@api_params
async def test_images_are_listed(cri_channel: aio.Channel, api: CriApi) -> None:
    images = api.images(cri_channel)
    listed = await images.ListImages(api.pb.ListImagesRequest(), timeout=10)
    assert {BUSYBOX_IMAGE, PAUSE_IMAGE} <= {tag for image in listed.images for tag in image.repo_tags}
    for ref in (BUSYBOX_IMAGE, PAUSE_IMAGE):
        status = await images.ImageStatus(api.pb.ImageStatusRequest(image=api.pb.ImageSpec(image=ref)), timeout=10)
        assert ref in status.image.repo_tags
        assert status.image.size > 0


@api_params
async def test_pull_image_from_loopback_registry(cri_channel: aio.Channel, registry: LoopbackRegistry,
                                                 api: CriApi, pod_log_dir: Path) -> None:
    images, pb = api.images(cri_channel), api.pb
    ref = registry.ref()
    spec = pb.ImageSpec(image=ref)
    pulled = await images.PullImage(pb.PullImageRequest(image=spec), timeout=60)
    status = await images.ImageStatus(pb.ImageStatusRequest(image=spec), timeout=10)
    assert status.image.id == pulled.image_ref
    assert ref in status.image.repo_tags

    # The pulled image runs.
    pod_id, container_id = await start_sleeper(api, cri_channel, pod_log_dir, image=ref)
    try:
        executed = await api.runtime(cri_channel).ExecSync(
            pb.ExecSyncRequest(container_id=container_id, cmd=["echo", "pulled"], timeout=10), timeout=20)
        assert executed.stdout == b"pulled\n"
    finally:
        await remove_pod_quietly(api, cri_channel, pod_id)

    await images.RemoveImage(pb.RemoveImageRequest(image=spec), timeout=30)
    assert not (await images.ImageStatus(pb.ImageStatusRequest(image=spec), timeout=10)).HasField("image")
    # A different image id: the imported busybox is still there.
    busybox = await images.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=BUSYBOX_IMAGE)), timeout=10)
    assert busybox.HasField("image")


async def test_runtime_status_is_ready(cri_channel: aio.Channel) -> None:
    status = await V1.runtime(cri_channel).Status(V1.pb.StatusRequest(), timeout=10)
    conditions = {c.type: c.status for c in status.status.conditions}
    assert conditions["RuntimeReady"] is True


@api_params
async def test_pod_and_container_lifecycle(cri_channel: aio.Channel, api: CriApi, pod_log_dir: Path) -> None:
    rt, pb = api.runtime(cri_channel), api.pb
    pod_config = pod_sandbox_config(pb, pod_log_dir)
    pod_id = (await rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_config), timeout=60)).pod_sandbox_id
    try:
        pod_status = await rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id), timeout=10)
        assert pod_status.status.state == pb.SANDBOX_READY
        assert pod_status.status.linux.namespaces.options.network == pb.NODE

        container_id = (await rt.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=container_config(pb), sandbox_config=pod_config),
            timeout=60)).container_id
        await rt.StartContainer(pb.StartContainerRequest(container_id=container_id), timeout=60)

        executed = await rt.ExecSync(pb.ExecSyncRequest(container_id=container_id, cmd=["echo", "hi"],
                                                        timeout=10), timeout=20)
        assert (executed.exit_code, executed.stdout, executed.stderr) == (0, b"hi\n", b"")

        status = await rt.ContainerStatus(pb.ContainerStatusRequest(container_id=container_id, verbose=True),
                                          timeout=10)
        assert status.status.state == pb.CONTAINER_RUNNING
        assert status.status.image.image == BUSYBOX_IMAGE
        info = verbose_info(status)
        pid = info["pid"]
        cgroup = cgroup_of(pid, "cpu")
        assert cgroup.is_dir()
        assert cgroup.name == container_id
        assert str(pid) in (cgroup / "cgroup.procs").read_text().split()
        assert info["runtimeSpec"]["linux"]["cgroupsPath"].endswith(container_id)

        await rt.StopContainer(pb.StopContainerRequest(container_id=container_id, timeout=10), timeout=30)
        status = await rt.ContainerStatus(pb.ContainerStatusRequest(container_id=container_id), timeout=10)
        assert status.status.state == pb.CONTAINER_EXITED
        assert status.status.exit_code == 0  # the trap ended it on SIGTERM, not SIGKILL
        assert not process_alive(pid)

        await rt.RemoveContainer(pb.RemoveContainerRequest(container_id=container_id), timeout=30)
        listed = await rt.ListContainers(pb.ListContainersRequest(), timeout=10)
        assert container_id not in {c.id for c in listed.containers}
        assert not cgroup.exists()

        await rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
        pod_status = await rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id), timeout=10)
        assert pod_status.status.state == pb.SANDBOX_NOTREADY
        await rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
        listed_pods = await rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10)
        assert pod_id not in {p.id for p in listed_pods.items}
    finally:
        await remove_pod_quietly(api, cri_channel, pod_id)


async def test_container_log_is_written(cri_channel: aio.Channel, pod_log_dir: Path) -> None:
    pod_id, _ = await start_sleeper(V1, cri_channel, pod_log_dir)
    try:
        # A pod log directory holds one directory per pod; the container logs as <name>.log.
        (pod_dir,) = pod_log_dir.iterdir()
        assert (pod_dir / "sleeper.log").exists()
    finally:
        await remove_pod_quietly(V1, cri_channel, pod_id)


def assert_cleaned_up(runtime: LocalContainerd, pids: list[int]) -> None:
    assert shim_pids(runtime.socket) == []
    assert mounts_under(runtime.base) == []
    assert [pid for pid in pids if process_alive(pid)] == []
    shutil.rmtree(runtime.base)  # nothing mounted or busy is left in it


async def running_pod_processes(runtime: LocalContainerd, log_dir: Path) -> list[int]:
    """Start a pod with a container; returns the pids of its shim(s) and its container."""
    async with aio.insecure_channel(runtime.address) as channel:
        _, container_id = await start_sleeper(V1, channel, log_dir)
        status = await V1.runtime(channel).ContainerStatus(
            V1.pb.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=10)
    shims = shim_pids(runtime.socket)
    assert shims, "a running pod has a shim"
    assert mounts_under(runtime.base), "a running container has its rootfs mounted"
    return [*shims, verbose_info(status)["pid"]]


async def test_stop_removes_pods_shims_and_mounts(own_containerd: LocalContainerd, tmp_path: Path) -> None:
    async with own_containerd:
        pids = await running_pod_processes(own_containerd, tmp_path / "logs")
    assert not own_containerd.socket.exists()  # containerd shut down cleanly
    assert_cleaned_up(own_containerd, pids)


async def test_stop_cleans_up_after_containerd_died(own_containerd: LocalContainerd, tmp_path: Path) -> None:
    await own_containerd.start()
    pids = await running_pod_processes(own_containerd, tmp_path / "logs")
    assert own_containerd.pid is not None
    # Without containerd, stop() cannot use CRI: containers, shims and mounts are left behind.
    os.kill(own_containerd.pid, signal.SIGKILL)
    await own_containerd.stop()
    assert_cleaned_up(own_containerd, pids)


async def test_stop_unmounts_only_what_containerd_mounted(own_containerd: LocalContainerd, tmp_path: Path) -> None:
    """An operator's tmpfs at DIR, and one below it, were there before: the
    stop leaves them, with what they hold (a lazy unmount of a tmpfs frees it)."""
    base = own_containerd.base
    keep = base / "keep"
    mounted: list[Path] = []
    try:
        for target in (base, keep):
            target.mkdir(parents=True, exist_ok=True)
            rc, out = await run_command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(target))
            assert rc == 0, out
            mounted.append(target)
            (target / "data.txt").write_text("the operator's")
        async with own_containerd:
            pids = await running_pod_processes(own_containerd, tmp_path / "logs")
        assert shim_pids(own_containerd.socket) == [] and [pid for pid in pids if process_alive(pid)] == []
        assert mounts_under(base) == [base, keep]
        assert (base / "data.txt").read_text() == (keep / "data.txt").read_text() == "the operator's"
    finally:
        for target in reversed(mounted):
            await run_command("umount", "-l", str(target))


async def test_start_fails_fast_with_the_log_tail(own_containerd: LocalContainerd) -> None:
    own_containerd.log_level = "no-such-level"  # containerd refuses to start
    with pytest.raises(LocalRuntimeError, match="exited with status") as failure:
        await own_containerd.start(timeout=30)
    assert "no-such-level" in str(failure.value)


async def test_a_second_start_on_the_same_directory_leaves_the_first_alone(
        own_containerd: LocalContainerd, pod_log_dir: Path) -> None:
    """Two runs on one directory would share one containerd socket: the second
    must stop at once, before it starts a containerd, imports images or stops pods."""
    second = LocalContainerd(own_containerd.base)
    async with own_containerd, aio.insecure_channel(own_containerd.address) as channel:
        pod_id, _ = await start_sleeper(V1, channel, pod_log_dir)
        shims = sorted(shim_pids(own_containerd.socket))
        try:
            with pytest.raises(LocalRuntimeError) as failure:
                await second.start(timeout=30)
            assert f"{own_containerd.base} is in use by another runtime-proxy (pid {os.getpid()}," in str(failure.value)
            assert second.pid is None
        finally:
            await second.stop()  # nothing of it is its own: the first's pods, shims and mounts stay
        status = await V1.runtime(channel).PodSandboxStatus(
            V1.pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id), timeout=10)
        assert status.status.state == V1.pb.SANDBOX_READY
        assert sorted(shim_pids(own_containerd.socket)) == shims
        assert (await V1.runtime(channel).Version(V1.pb.VersionRequest(), timeout=10)).runtime_name == "containerd"
    assert shim_pids(own_containerd.socket) == []  # the first's stop still cleans up its own


async def test_the_directory_stays_locked_across_a_restart_and_is_freed_by_stop(
        own_containerd: LocalContainerd) -> None:
    """A containerd that died is started again by the same instance (the fault
    tests do): its directory is still its own, and no other instance's meanwhile."""
    await own_containerd.start(images=False)
    assert own_containerd.pid is not None
    os.kill(own_containerd.pid, signal.SIGKILL)
    await own_containerd._proc.wait()  # type: ignore[union-attr]
    with pytest.raises(LocalRuntimeError, match="in use by another runtime-proxy"):
        await LocalContainerd(own_containerd.base).start(images=False)
    await own_containerd.start(images=False)
    await own_containerd.stop()
    await own_containerd.start(images=False)  # stopped, then started again
    await own_containerd.stop()
    after = LocalContainerd(own_containerd.base)
    await after.start(images=False)  # stop() gave the directory up
    await after.stop()
