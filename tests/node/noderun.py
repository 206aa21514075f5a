"""One kubelet run on the node tier's containerd: start, pods, and the clean-up of everything
kubelet leaves on the host (pods, cgroups, /var/log entries)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path

from grpc import aio

from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.host.images import PAUSE_IMAGE

from . import manifests, runtime
from .cgroups import CgroupRoot
from .kubelet import Kubelet
from .manifests import StaticPod

# Generous: the CI machine is shared, and a loaded 2-core box is slow. The figures
# measured are logged, so a slow run shows.
RUNNING_TIMEOUT = 90.0
STOP_TIMEOUT = 20.0  # kubelet checks the manifest directory every 2 s; the grace period is 1 s


class NodeRun(contextlib.AbstractAsyncContextManager["NodeRun"]):
    """kubelet pointed at `endpoint` (the proxy, or containerd for a direct run), with the
    tier's static pods; on exit kubelet is stopped and nothing of this run is left."""

    def __init__(self, binary: Path, base: Path, containerd: LocalContainerd, endpoint: Path,
                 pods: tuple[StaticPod, ...] = manifests.PODS) -> None:
        self.containerd = containerd
        self.cgroups = CgroupRoot()
        self.kubelet = Kubelet(binary, base, endpoint, PAUSE_IMAGE, self.cgroups)
        self.pods = pods
        self.started_at = 0.0  # loop time when the manifests were written

    @property
    def node_name(self) -> str:
        return self.kubelet.node_name

    def pod_name(self, pod: StaticPod) -> str:
        return pod.pod_name(self.node_name)

    async def __aenter__(self) -> NodeRun:
        self.cgroups.make()
        try:
            await self.kubelet.start()
            self.started_at = asyncio.get_running_loop().time()
            for pod in self.pods:
                pod.write(self.kubelet.manifests)
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def channel(self) -> aio.Channel:
        """A channel to containerd itself: what the runtime really holds."""
        return aio.insecure_channel(self.containerd.address)

    async def wait_running(self, timeout: float = RUNNING_TIMEOUT) -> dict[str, runtime.Pod]:
        """Until every pod's sandbox is ready and all its containers run, as the runtime says."""
        wanted = {self.pod_name(p): p.containers for p in self.pods}
        async with self.channel() as channel:
            async def all_running() -> dict[str, runtime.Pod] | None:
                found = await runtime.pods(channel)
                ok = all(name in found and found[name].running(names) for name, names in wanted.items())
                return found if ok else None

            return await runtime.wait_for(f"pods {sorted(wanted)} running", all_running, timeout)

    async def remove(self, pod: StaticPod) -> float:
        """Remove the pod's manifest and wait until the runtime has stopped the pod; seconds it took."""
        loop = asyncio.get_running_loop()
        removed_at = loop.time()
        pod.path(self.kubelet.manifests).unlink()
        self.pods = tuple(p for p in self.pods if p is not pod)
        name = self.pod_name(pod)
        async with self.channel() as channel:
            async def stopped() -> bool:
                found = (await runtime.pods(channel)).get(name)
                return found is None or found.stopped()

            await runtime.wait_for(f"pod {name} stopped after its manifest was removed", stopped, STOP_TIMEOUT)
        return loop.time() - removed_at

    async def close(self) -> None:
        """kubelet first (nothing recreates pods then), its pods, then what it left on the host.

        Raises if a cgroup would not go: a leak on a shared machine is a failure."""
        await self.kubelet.stop()
        if self.containerd.pid is not None:
            async with self.channel() as channel:
                await runtime.remove_all_pods(channel)
        left = await self.cgroups.remove()
        runtime.remove_pod_logs(self.node_name)
        shutil.rmtree(self.kubelet.root_dir, ignore_errors=True)
        if left:
            raise AssertionError(f"cgroups left behind by kubelet's pods: {left}")
