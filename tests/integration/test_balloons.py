"""Issue 10 with real parts: the balloons hook in front of containerd 1.6 + runc,
through the proxy; placements read from each container's cpuset cgroup.

This machine has CPUs 0 and 1: CPU 0 is reserved (kube-system), the ``work``
balloon type gets what is left. An empty balloon runs its containers on the
reserved CPU, so growth (0 -> 1 CPU) and shrink (1 -> 0) move them between
"0" and "1".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import yaml
from grpc import aio

from hooks.balloons.server import BalloonsHook
from hooks.balloons.status import read_status
from hooks.sdk import write_hook_config

from ..hookprocs import registered
from .crihelpers import V1, cgroup_of, container_config, pod_sandbox_config
from .proxyfixtures import ProxyLauncher
from .test_hooks_real import container_pid
from .test_localruntime import remove_pod_quietly

pb = V1.pb
WORK_NS = "balloons-apps"


def config(proxy_socket: Path) -> dict:
    return {
        "reservedResources": {"cpu": "cpuset:0"},
        "reservedPoolNamespaces": ["kube-system"],
        "runtimeEndpoint": str(proxy_socket),
        "balloonTypes": [{"name": "work", "namespaces": [WORK_NS], "maxBalloons": 1}],
    }


@contextlib.asynccontextmanager
async def balloons_hook(launcher: ProxyLauncher, config_path: Path) -> AsyncIterator[BalloonsHook]:
    hook = BalloonsHook.from_config_file(str(launcher.dir / "balloons.sock"), config_path)
    async with hook:
        background = asyncio.create_task(hook.background())
        registration = write_hook_config(launcher.hook_dir, "balloons", hook.socket_path, [h.value for h in hook.HOOKS], "Fail", "5s")
        try:
            yield hook
        finally:
            registration.unlink(missing_ok=True)
            background.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await background


async def run_pod(channel: aio.Channel, log_dir: Path, namespace: str, shares: int) -> tuple[str, str]:
    rt = V1.runtime(channel)
    pod_config = pod_sandbox_config(pb, log_dir, namespace=namespace)
    pod_id = (await rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_config), timeout=60)).pod_sandbox_id
    try:
        config = container_config(pb, resources=pb.LinuxContainerResources(cpu_shares=shares))
        cid = (await rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config), timeout=60)).container_id
        await rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
    except BaseException:
        await remove_pod_quietly(V1, channel, pod_id)
        raise
    return pod_id, cid


async def cpuset_of(channel: aio.Channel, cid: str) -> str:
    pid = await container_pid(V1, channel, cid)
    return (cgroup_of(pid, "cpuset") / "cpuset.cpus").read_text().strip()


async def lands_on(channel: aio.Channel, cid: str, cpus: str, timeout: float = 20.0) -> None:
    """Until the container's cgroup shows ``cpus`` (a move is asynchronous; cgroupfs has no change events)."""
    async with asyncio.timeout(timeout):
        while (now := await cpuset_of(channel, cid)) != cpus:
            await asyncio.sleep(0.1)
    assert now == cpus


async def rebuilt(hook: BalloonsHook, timeout: float = 20.0) -> dict:
    """The hook's status once it has rebuilt its assignments from the runtime."""
    async with asyncio.timeout(timeout):
        while not (status := await read_status(hook.status_socket))["ready"]:
            await asyncio.sleep(0.1)
    return status


def placements(status: dict) -> dict[str, tuple[str, str]]:
    """container id -> (balloon, cpus it runs on)."""
    return {c["id"]: (b["name"], b["effective_cpus"]) for b in status["balloons"] for c in b["containers"]}


async def test_balloons_pin_grow_shrink_and_survive_restarts(launcher, pod_log_dir, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="hooks.balloons")
    config_path = tmp_path / "balloons.yaml"
    config_path.write_text(yaml.safe_dump(config(launcher.socket)))
    running, proxy_stack = await launcher.start()
    pods: list[str] = []
    try:
        async with launcher.channel() as channel:
            async with balloons_hook(launcher, config_path) as hook:
                await registered(running, 1)
                await rebuilt(hook)
                system_pod, system = await run_pod(channel, pod_log_dir, "kube-system", 2)
                pods.append(system_pod)
                assert await cpuset_of(channel, system) == "0"
                assert any(
                    r.getMessage().startswith("assigning container kube-system/") and r.getMessage().endswith('to balloon reserved[0]{cpus:"0", mems:"0"}')
                    for r in caplog.records
                )
                # A best-effort container in the empty work balloon runs on the reserved CPU...
                light_pod, light = await run_pod(channel, pod_log_dir, WORK_NS, 2)
                pods.append(light_pod)
                assert await cpuset_of(channel, light) == "0"
                # ... until a container asking for a CPU grows the balloon: both run on CPU 1.
                heavy_pod, heavy = await run_pod(channel, pod_log_dir, WORK_NS, 1024)
                pods.append(heavy_pod)
                assert await cpuset_of(channel, heavy) == "1"
                await lands_on(channel, light, "1")
                before = placements(await read_status(hook.status_socket))
                assert before[system] == ("reserved[0]", "0")
                assert before[light] == before[heavy] == ("work[0]", "1")

            # The hook server restarts: it rebuilds the same placements from the containers' cpusets.
            async with balloons_hook(launcher, config_path) as hook:
                await registered(running, 1)
                status = await rebuilt(hook)
                assert placements(status) == before, status
                # It still knows CPU 1 is taken: a second CPU for the work balloon does not exist.
                with pytest.raises(aio.AioRpcError) as refused:
                    await run_pod(channel, pod_log_dir, WORK_NS, 1024)
                assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "no balloon can take container" in refused.value.details()
                # Shrink: the heavy container stops, the balloon gives CPU 1 back.
                await V1.runtime(channel).StopContainer(pb.StopContainerRequest(container_id=heavy, timeout=5), timeout=30)
                await lands_on(channel, light, "0")

                # The proxy restarts under the running hook: its calls still reach the same assignments.
                await proxy_stack.aclose()
                running, proxy_stack = await launcher.start()
                await registered(running, 1)
                async with launcher.channel() as channel2:
                    again_pod, again = await run_pod(channel2, pod_log_dir, WORK_NS, 1024)
                    pods.append(again_pod)
                    assert await cpuset_of(channel2, again) == "1"
                    await lands_on(channel2, light, "1")
                    assert await cpuset_of(channel2, system) == "0"
    finally:
        async with launcher.channel() as channel:
            for pod_id in pods:
                await remove_pod_quietly(V1, channel, pod_id)
