"""A pod a PreRunPodSandbox hook moves to another cgroup parent, with
containerd 1.6 and runc: its containers' cgroups land under the new parent,
read from /proc/<pid>/cgroup (containerd places a container by the
sandbox_config of its CreateContainer, kubelet's copy of the pod config)."""

from __future__ import annotations

from runtimeproxy.host.crispec import container_config, pod_sandbox_config

from ..hookprocs import hook_server, registered
from .batchhelpers import PodCgroup
from .crihelpers import V1, cgroup_of
from .test_hooks_real import container_pid
from .test_localruntime import remove_pod_quietly


async def test_containers_land_under_the_parent_a_pod_hook_chose(cri_channel, launcher, pod_log_dir) -> None:
    pb = V1.pb
    config = pod_sandbox_config(pb, pod_log_dir, name="moved")
    kubelets, moved = PodCgroup.new(config.metadata.uid), PodCgroup.new(config.metadata.uid)
    config.linux.cgroup_parent = kubelets.parent
    kubelets.make()  # as kubelet does before RunPodSandbox; the hook makes its own
    moved.make()
    running, _ = await launcher.start()
    pod_id = ""
    try:
        async with hook_server(launcher.dir, "mover", {"PreRunPodSandbox": {"cgroup_parent": moved.parent}}) as hook, \
                launcher.channel() as channel:
            hook.register(launcher.hook_dir, ["PreRunPodSandbox"])
            await registered(running, 1)
            rt = V1.runtime(channel)
            pod_id = (await rt.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60)).pod_sandbox_id
            cid = (await rt.CreateContainer(
                pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config(pb), sandbox_config=config), timeout=60
            )).container_id
            await rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
            pid = await container_pid(V1, channel, cid)
            for controller in ("cpu", "memory"):
                assert cgroup_of(pid, controller) == moved.path(controller) / cid
            assert not (kubelets.path("cpu") / cid).exists()
    finally:
        if pod_id:
            await remove_pod_quietly(V1, cri_channel, pod_id)
        await moved.remove()
        await kubelets.remove()
