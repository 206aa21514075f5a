"""The built-in hook servers that keep state, SIGKILLed and restarted between
pods in front of a real containerd 1.6: what the containers' cgroups show
before the kill is what they show after, and the next pods are placed by the
state the restarted hook rebuilt (balloons: from the runtime's containers,
one created and not started among them; batchresource: from its state
directory and the pod cgroups, with what changed while it was down: a pod
gone, a pod cgroup value changed, a temporary state file left by the kill)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import yaml
from grpc import aio

from runtimeproxy.app import RunningProxy
from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.host.crispec import container_config, pod_sandbox_config

from ..hookprocs import registered
from ..integration.batchhelpers import HookRun, batchresource_hook
from ..integration.crihelpers import V1
from ..integration.proxyfixtures import ProxyLauncher
from ..integration.test_balloons import (
    WORK_NS, HookProcess, balloons_hook, cpuset_of, lands_on, placements, run_pod,
)
from ..integration.test_batchresource import BE, MIB, batch, container_values, pod, pod_values, spec, start_container
from ..integration.test_localruntime import remove_pod_quietly


def balloons(launcher: ProxyLauncher, config: Path) -> contextlib.AbstractAsyncContextManager[HookProcess]:
    """``hook run balloons`` once it rebuilt its assignments (from the runtime's
    containers, after a restart), until the block ends (or the test kills it)."""
    return balloons_hook(launcher, config, ready="assignments rebuilt from", timeout=30)


async def create_pod(channel: aio.Channel, log_dir: Path, namespace: str, shares: int) -> tuple[str, str]:
    """A pod and its container, created and not started (its pod id, container id)."""
    rt, pb = V1.runtime(channel), V1.pb
    pod_config = pod_sandbox_config(pb, log_dir, namespace=namespace)
    pod_id = (await rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_config), timeout=60)).pod_sandbox_id
    config = container_config(pb, resources=pb.LinuxContainerResources(cpu_shares=shares))
    try:
        request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config)
        return pod_id, (await rt.CreateContainer(request, timeout=60)).container_id
    except BaseException:
        await remove_pod_quietly(V1, channel, pod_id)
        raise


def members(status: dict) -> dict[str, list[str]]:
    """balloon name -> the ids of its containers ('' for one not started yet)."""
    return {b["name"]: [c["id"] for c in b["containers"]] for b in status["balloons"] if b["containers"]}


@contextlib.asynccontextmanager
async def balloons_node(
    own_containerd: LocalContainerd,
) -> AsyncIterator[tuple[ProxyLauncher, Path, RunningProxy, aio.Channel, list[str]]]:
    """The proxy in front of the started ``own_containerd``, a balloons config
    (CPU 0 reserved) for ``balloons``, a channel to the proxy, and the list of
    pods the test made: removed at the end."""
    await own_containerd.start(timeout=60)
    pods: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        launcher = ProxyLauncher(own_containerd.socket, stack)
        config = launcher.dir / "balloons.yaml"
        config.write_text(balloons_config(launcher.socket, 0))
        running, _ = await launcher.start()
        channel = await stack.enter_async_context(launcher.channel())
        try:
            yield launcher, config, running, channel, pods
        finally:
            for pod_id in pods:
                await remove_pod_quietly(V1, channel, pod_id)


async def sigkill(process: asyncio.subprocess.Process) -> None:
    os.kill(process.pid, signal.SIGKILL)
    await process.wait()


async def test_balloons_hook_sigkilled_between_pods_rebuilds_its_balloons(
    own_containerd: LocalContainerd, pod_log_dir: Path
) -> None:
    async with balloons_node(own_containerd) as (launcher, config, running, channel, pods):
        async with balloons(launcher, config) as hook:
            await registered(running, 1)
            system_pod, system = await run_pod(channel, pod_log_dir, "kube-system", 2)
            pods.append(system_pod)
            assert await cpuset_of(channel, system) == "0"
            # A container created, not started yet, when the hook dies: it holds work[0]'s CPU.
            heavy_pod, heavy = await create_pod(channel, pod_log_dir, WORK_NS, 1024)
            pods.append(heavy_pod)
            assert members(json.loads(await hook.status("--json"))) == {
                "reserved[0]": [system], "work[0]": [""]}  # its id is learnt at PreStartContainer
            await sigkill(hook.process)
        async with balloons(launcher, config) as hook:
            await registered(running, 1)
            assert members(json.loads(await hook.status("--json"))) == {"reserved[0]": [system], "work[0]": [heavy]}
            await V1.runtime(channel).StartContainer(V1.pb.StartContainerRequest(container_id=heavy), timeout=60)
            assert (await cpuset_of(channel, system), await cpuset_of(channel, heavy)) == ("0", "1")
            # The rebuilt work balloon is full for another CPU-asking container
            # (maxBalloons 1, CPU 1 taken); a best-effort one joins it on CPU 1.
            light_pod, light = await run_pod(channel, pod_log_dir, WORK_NS, 2)
            pods.append(light_pod)
            assert await cpuset_of(channel, light) == "1"
            try:
                pods.append((await run_pod(channel, pod_log_dir, WORK_NS, 1024))[0])
            except aio.AioRpcError as err:
                assert "no balloon can take container" in err.details(), err.details()
            else:
                raise AssertionError("the restarted hook forgot that the created container holds CPU 1")
            assert placements(json.loads(await hook.status("--json"))) == {
                system: ("reserved[0]", "0"), heavy: ("work[0]", "1"), light: ("work[0]", "1")}


def balloons_config(proxy_socket: Path, reserved: int) -> str:
    return yaml.safe_dump({"reservedResources": {"cpu": f"cpuset:{reserved}"}, "runtimeEndpoint": str(proxy_socket),
                           "balloonTypes": [{"name": "work", "namespaces": [WORK_NS], "maxBalloons": 1}]})


async def test_balloons_hook_sigkilled_as_a_reload_moves_containers_finishes_the_moves_after_restart(
    own_containerd: LocalContainerd, pod_log_dir: Path
) -> None:
    """The reserved CPU changes from 0 to 1: both containers move, and the hook
    dies as the first move is made (before or after it landed: either way the
    restarted hook, reading the new config, finds them where they are and moves
    what is left)."""
    async with balloons_node(own_containerd) as (launcher, config, running, channel, pods):
        async with balloons(launcher, config) as hook:
            await registered(running, 1)
            system_pod, system = await run_pod(channel, pod_log_dir, "kube-system", 2)
            pods.append(system_pod)
            work_pod, work = await run_pod(channel, pod_log_dir, WORK_NS, 1024)
            pods.append(work_pod)
            assert (await cpuset_of(channel, system), await cpuset_of(channel, work)) == ("0", "1")
            new = config.with_suffix(".new")
            new.write_text(balloons_config(launcher.socket, 1))
            os.replace(new, config)
            await hook.logged("moving container", timeout=30)
            await sigkill(hook.process)
        async with balloons(launcher, config) as hook:
            await registered(running, 1)
            await lands_on(channel, system, "1")
            await lands_on(channel, work, "0")
            assert placements(json.loads(await hook.status("--json"))) == {
                system: ("reserved[0]", "1"), work: ("work[0]", "0")}


async def restored(hook: HookRun, pod_name: str, field: str) -> dict:
    return await hook.logged(lambda line: line.get("msg") == "batchresource reconcile restored a pod cgroup value"
                             and line.get("pod") == pod_name and line.get("field") == field)


async def test_batchresource_hook_sigkilled_between_pods_keeps_its_pods(
    own_containerd: LocalContainerd, pod_log_dir: Path
) -> None:
    await own_containerd.start(timeout=60)
    async with contextlib.AsyncExitStack() as stack:
        launcher = ProxyLauncher(own_containerd.socket, stack)
        running, _ = await launcher.start()
        channel = await stack.enter_async_context(launcher.channel())
        direct = await stack.enter_async_context(aio.insecure_channel(own_containerd.address))
        state = launcher.dir / "batch-state"
        async with batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms") as hook:
            await registered(running, 1)
            kept = await stack.enter_async_context(
                pod(channel, direct, pod_log_dir, BE, spec(main=batch("500", "128Mi"), side=batch("250", "64Mi"))))
            _, main = await start_container(channel, kept, "main")
            async with pod(channel, direct, pod_log_dir, BE, spec(main=batch("250", "64Mi"))) as gone:
                await start_container(channel, gone, "main")
                assert sorted(os.listdir(state)) == sorted(f"{p.config.metadata.uid}.json" for p in (kept, gone))
                await sigkill(hook.process)
            # While the hook is down: the other pod goes (stopped, removed, its cgroup
            # too), and something raises the kept pod's CPU shares.
            kept.cgroup.write("cpu", "cpu.shares", 4096)
            # What a kill between a state file's write and its rename leaves.
            (state / f".{kept.config.metadata.uid}.json.x1y2z3.tmp").write_text('{"uid": ')
        async with batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms") as hook:
            await registered(running, 1)
            line = await restored(hook, f"{kept.config.metadata.namespace}/{kept.config.metadata.name}", "cpu_shares")
            assert (line["found"], line["restored"]) == (4096, 768)
            assert pod_values(kept.cgroup) == (768, 75000, 192 * MIB)
            assert container_values(main) == (512, 50000, 128 * MIB)
            line = await hook.logged(lambda line: line.get("msg") == "batchresource pod forgotten")
            assert (line["uid"], line["reason"]) == (gone.config.metadata.uid, "pod cgroup is gone")
            assert sorted(os.listdir(state)) == [f"{kept.config.metadata.uid}.json"]
            # The kept pod's next container, and a new pod, get their values.
            _, side = await start_container(channel, kept, "side")
            assert container_values(side) == (256, 25000, 64 * MIB)
            async with pod(channel, direct, pod_log_dir, BE, spec(main=batch("300", "32Mi"))) as new:
                _, new_main = await start_container(channel, new, "main")
                assert pod_values(new.cgroup) == container_values(new_main) == (307, 30000, 32 * MIB)
