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
import itertools
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import yaml
from grpc import aio

from runtimeproxy.host.containerd import terminate_process
from hooks.balloons.runtime import POD_UID_LABEL, ExitedContainer, RuntimeClient
from runtimeproxy.host.crispec import container_config, pod_sandbox_config

from ..hookprocs import registered
from .crihelpers import V1, cgroup_of
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


@dataclass
class HookProcess:
    """A ``runtime-proxy hook run balloons`` process and its log, read as it comes."""

    process: asyncio.subprocess.Process
    socket: Path
    lines: list[str] = field(default_factory=list)
    ended: bool = False
    _more: asyncio.Event = field(default_factory=asyncio.Event)

    async def read_log(self) -> None:
        assert self.process.stderr is not None
        async for line in self.process.stderr:
            self.lines.append(line.decode())
            self._more.set()
        self.ended = True
        self._more.set()

    async def logged(self, needle: str, timeout: float = 20.0) -> str:
        async with asyncio.timeout(timeout):
            while True:
                seen = len(self.lines)
                found = next((line for line in self.lines if needle in line), None)
                if found is not None:
                    return found
                if self.ended:
                    raise AssertionError(f"hook exited ({await self.process.wait()}) before {needle!r}: {''.join(self.lines)}")
                await self.more(seen)

    async def more(self, seen: int) -> None:
        """Until the hook has logged more than ``seen`` lines (or ended)."""
        while len(self.lines) <= seen and not self.ended:
            self._more.clear()
            await self._more.wait()

    async def status(self, *args: str) -> str:
        return await runtime_proxy("hook", "balloons", "status", "--socket", str(self.socket), *args)


async def runtime_proxy(*args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy.cli", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    return out.decode()


@contextlib.asynccontextmanager
async def balloons_hook(
    launcher: ProxyLauncher, config_path: Path, ready: str = "hook registered", timeout: float = 20.0
) -> AsyncIterator[HookProcess]:
    """``hook run balloons`` from once it logged ``ready`` to the block's end (or the test's kill)."""
    socket = launcher.dir / "balloons.sock"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy.cli", "hook", "run", "balloons", "--socket", str(socket),
        "--hook-dir", str(launcher.hook_dir), "--config", str(config_path), "--failure-policy", "Fail",
        "--timeout", "15s", "--drain", "0", stderr=asyncio.subprocess.PIPE,
    )
    hook = HookProcess(process, socket)
    reader = asyncio.create_task(hook.read_log())
    try:
        await hook.logged(ready, timeout)
        yield hook
    finally:
        await terminate_process(process, 10, "hook run balloons")
        await reader


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
        while (now := await cpuset_of(channel, cid)) != cpus:  # noqa: ASYNC110 - cgroupfs has no change events; bounded
            await asyncio.sleep(0.1)
    assert now == cpus


async def rebuilt(hook: HookProcess) -> dict:
    """The hook's status (``hook balloons status --json``) once it has rebuilt its assignments."""
    await hook.logged("assignments rebuilt from")
    return json.loads(await hook.status("--json"))


def placements(status: dict) -> dict[str, tuple[str, str]]:
    """container id -> (balloon, cpus it runs on)."""
    return {c["id"]: (b["name"], b["effective_cpus"]) for b in status["balloons"] for c in b["containers"]}


async def test_balloons_pin_grow_shrink_and_survive_restarts(launcher, pod_log_dir, tmp_path) -> None:
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
                line = await hook.logged("assigning container kube-system/")
                assert '/sleeper to balloon reserved[0]{cpus:"0", mems:"0"}' in line
                # A best-effort container gets a CPU of its own in the work balloon
                # (as in NRI's balloons: not the reserved one)...
                light_pod, light = await run_pod(channel, pod_log_dir, WORK_NS, 2)
                pods.append(light_pod)
                assert await cpuset_of(channel, light) == "1"
                # ... which a container asking for one CPU joins: both run on CPU 1.
                heavy_pod, heavy = await run_pod(channel, pod_log_dir, WORK_NS, 1024)
                pods.append(heavy_pod)
                assert await cpuset_of(channel, heavy) == "1"
                assert await cpuset_of(channel, light) == "1"
                before = placements(json.loads(await hook.status("--json")))
                text = await hook.status()
                assert 'work[0]{cpus:"1", mems:"0"}' in text and heavy[:13] in text
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
                # The heavy container stops: the light one keeps the balloon's CPU.
                await V1.runtime(channel).StopContainer(pb.StopContainerRequest(container_id=heavy, timeout=5), timeout=30)
                await hook.logged(f"releasing container {WORK_NS}/")

                # The proxy restarts under the running hook: its calls still reach the same assignments.
                await proxy_stack.aclose()
                running, proxy_stack = await launcher.start()
                await registered(running, 1)
                after = placements(json.loads(await hook.status("--json")))
                assert after == {system: ("reserved[0]", "0"), light: ("work[0]", "1")}
                async with launcher.channel() as channel2:
                    again_pod, again = await run_pod(channel2, pod_log_dir, WORK_NS, 1024)
                    pods.append(again_pod)
                    assert await cpuset_of(channel2, again) == "1"
                    # Shrink: both stop, and the empty balloon gives CPU 1 back.
                    released = sum("releasing container" in line for line in hook.lines)
                    for cid in (light, again):
                        await V1.runtime(channel2).StopContainer(pb.StopContainerRequest(container_id=cid, timeout=5), timeout=30)
                    async with asyncio.timeout(20):
                        while sum("releasing container" in line for line in hook.lines) < released + 2:
                            await hook.more(len(hook.lines))
                    status = json.loads(await hook.status("--json"))
                    assert [b["cpus"] for b in status["balloons"] if b["type"] == "work"] in ([], [""])
                    assert await cpuset_of(channel2, system) == "0"
    finally:
        async with launcher.channel() as channel:
            for pod_id in pods:
                await remove_pod_quietly(V1, channel, pod_id)


async def test_a_restart_keeps_the_reserved_cpus_saved_in_the_state_dir(launcher, tmp_path) -> None:
    """One reserved CPU given as a quantity, and stateDir: the first start
    finds nothing saved, deduces CPU 0 and saves it (reserved.json and
    balloons.json, no temporary file left). Saved as 1, as a hotplug or
    reload may leave it with nothing running to tell, the restart keeps 1
    (it deduced 0), and does not use the balloons saved with 0."""
    state = tmp_path / "state"
    config_path = tmp_path / "balloons.yaml"
    doc = {**config(launcher.socket), "reservedResources": {"cpu": "1"}, "stateDir": str(state)}
    config_path.write_text(yaml.safe_dump(doc))
    running, _ = await launcher.start()
    async with balloons_hook(launcher, config_path) as hook:
        await registered(running, 1)
        assert "none saved in" in await hook.logged("reserved CPUs 0 at start: deduced")
        assert (await rebuilt(hook))["reserved_cpus"] == "0"
        await hook.logged("reserved CPUs 0 saved to")
    saved = json.loads((state / "reserved.json").read_text())
    assert saved["reserved_cpus"] == "0" and sorted(p.name for p in state.iterdir()) == ["balloons.json", "reserved.json"]
    (state / "reserved.json").write_text(json.dumps({**saved, "reserved_cpus": "1"}))
    async with balloons_hook(launcher, config_path) as hook:
        await registered(running, 1)
        assert f"the saved set in {state / 'reserved.json'}" in await hook.logged("reserved CPUs 1 at start")
        # The saved balloons name 0: they no longer agree, and are not used.
        assert "names reserved CPUs 0, the restart keeps 1" in await hook.logged("balloons at start: rebuilt from")
        assert (await rebuilt(hook))["reserved_cpus"] == "1"


async def test_a_restart_puts_back_a_container_found_off_its_saved_balloon(launcher, pod_log_dir, tmp_path) -> None:
    """stateDir set: a work container's cpuset changed behind the hook's
    back while it was down (to every CPU, as kubelet restarting it leaves
    it): the next start still uses the saved balloons, puts the container
    back in its saved balloon and moves it there, saying so once (before:
    the saved balloons were not used, "but it runs on 0-1", and the
    balloons were rebuilt from the cpusets)."""
    state = tmp_path / "state"
    config_path = tmp_path / "balloons.yaml"
    config_path.write_text(yaml.safe_dump({**config(launcher.socket), "stateDir": str(state)}))
    running, _ = await launcher.start()
    pod_id = ""
    try:
        async with launcher.channel() as channel:
            async with balloons_hook(launcher, config_path) as hook:
                await registered(running, 1)
                await rebuilt(hook)
                pod_id, cid = await run_pod(channel, pod_log_dir, WORK_NS, 1024)
                assert await cpuset_of(channel, cid) == "1"
            # Its stop wrote the last balloons (SavedSet.finish).
            saved = json.loads((state / "balloons.json").read_text())
            assert [(b["type"], b["cpuset"], len(b["members"])) for b in saved["balloons"]] == [("reserved", "0", 0), ("work", "1", 1)]
            runtime = RuntimeClient(str(launcher.backend))  # straight to containerd: no hook sees it
            try:
                await runtime.update_cpuset(cid, "0-1", "0")
            finally:
                await runtime.close()
            assert await cpuset_of(channel, cid) == "0-1"
            async with balloons_hook(launcher, config_path) as hook:
                await registered(running, 1)
                line = await hook.logged("balloons at start:")
                assert f"the saved balloons in {state / 'balloons.json'} (1 container(s) put back in their saved balloon; " \
                    "1 to move)" in line and f'put_back="{WORK_NS}/' in line and ' in work[0]" not_put_back=""' in line, line
                await lands_on(channel, cid, "1")
                assert placements(json.loads(await hook.status("--json")))[cid] == ("work[0]", "1")
    finally:
        if pod_id:
            async with launcher.channel() as channel:
                await remove_pod_quietly(V1, channel, pod_id)


async def rewrite_until(hook: HookProcess, path: Path, doc: object, needle: str) -> None:
    """Write the config until the hook logs ``needle`` once more (its file watcher
    gives no sign of being ready, so a write before it watches is repeated)."""
    seen = sum(needle in line for line in hook.lines)
    async with asyncio.timeout(30):
        for attempt in itertools.count():
            path.write_text(yaml.safe_dump(doc) + f"# write {attempt}\n")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    while sum(needle in line for line in hook.lines) == seen:
                        await hook.more(len(hook.lines))
                    return


async def test_config_reloads_and_exhausted_policy(launcher, pod_log_dir, tmp_path) -> None:
    config_path = tmp_path / "balloons.yaml"
    good = config(launcher.socket)
    config_path.write_text(yaml.safe_dump(good))
    running, _ = await launcher.start()
    pods: list[str] = []
    try:
        async with launcher.channel() as channel, balloons_hook(launcher, config_path) as hook:
            await registered(running, 1)
            await rebuilt(hook)
            first_pod, first = await run_pod(channel, pod_log_dir, WORK_NS, 1024)
            pods.append(first_pod)
            assert await cpuset_of(channel, first) == "1"

            # A broken config is logged; the last good one stays (work is still exhausted under Fail).
            await rewrite_until(hook, config_path, {**good, "onExhausted": "Sometimes"}, "config reload failed")
            with pytest.raises(aio.AioRpcError) as refused:
                await run_pod(channel, pod_log_dir, WORK_NS, 1024)
            assert "no balloon can take container" in refused.value.details()

            # onExhausted: Ignore: the container lands in the default balloon (no CPU of its own: the reserved one).
            await rewrite_until(hook, config_path, {**good, "onExhausted": "Ignore"}, "config reloaded")
            second_pod, second = await run_pod(channel, pod_log_dir, WORK_NS, 1024)
            pods.append(second_pod)
            assert await cpuset_of(channel, second) == "0"
            assert placements(json.loads(await hook.status("--json")))[second] == ("default[0]", "0")

            # The work namespace becomes a reserved one: its running container moves to the reserved CPU.
            moved = {**good, "onExhausted": "Ignore", "reservedPoolNamespaces": ["kube-system", WORK_NS]}
            await rewrite_until(hook, config_path, moved, "config reloaded")
            await lands_on(channel, first, "0")
            assert placements(json.loads(await hook.status("--json")))[first] == ("reserved[0]", "0")
    finally:
        async with launcher.channel() as channel:
            for pod_id in pods:
                await remove_pod_quietly(V1, channel, pod_id)


async def test_the_runtime_listing_reports_an_exited_init_container(launcher, pod_log_dir) -> None:
    """What reconcile releases at once: kubelet keeps a finished init container
    (EXITED) until its pod goes, so no stop event comes for it. One
    ListPodSandbox + ListContainers gives it with its key, next to the live one
    (with its created_at); and so does the one-pod listing of a refused container's pod (by kubelet's
    pod uid label)."""
    await launcher.start()
    runtime = RuntimeClient(str(launcher.socket))
    pod_id = ""
    try:
        async with launcher.channel() as channel:
            rt = V1.runtime(channel)
            pod_config = pod_sandbox_config(pb, pod_log_dir, namespace=WORK_NS)
            uid = pod_config.metadata.uid
            pod_id = (await rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_config), timeout=60)).pod_sandbox_id
            ids = {}
            for name, command in (("init", ("true",)), ("sleeper", ("sleep", "3600"))):
                config = container_config(pb, name=name, command=command, labels={POD_UID_LABEL: uid})
                ids[name] = (await rt.CreateContainer(
                    pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config), timeout=60
                )).container_id
                await rt.StartContainer(pb.StartContainerRequest(container_id=ids[name]), timeout=60)
            async with asyncio.timeout(20):
                request = pb.ContainerStatusRequest(container_id=ids["init"])
                while (await rt.ContainerStatus(request, timeout=10)).status.state != pb.CONTAINER_EXITED:  # noqa: ASYNC110 - runc's exit seen through CRI status, no event here; bounded
                    await asyncio.sleep(0.1)
            listing = await runtime.list_containers()
            assert ExitedContainer(ids["init"], (uid, "init")) in listing.exited
            assert {(f.key, f.container_id) for f in listing.live if f.pod_uid == uid} == {((uid, "sleeper"), ids["sleeper"])}
            # When it was created, as its status says: a restart places those it has no saved balloon for in this order.
            [sleeper] = [f for f in listing.live if f.container_id == ids["sleeper"]]
            status = (await rt.ContainerStatus(pb.ContainerStatusRequest(container_id=ids["sleeper"]), timeout=10)).status
            assert sleeper.created_at == status.created_at > 0
            assert await runtime.pod_containers(uid, 5) == ({(uid, "sleeper")}, [ExitedContainer(ids["init"], (uid, "init"))])
            assert await runtime.pod_containers("another-uid", 5) == (set(), [])
    finally:
        await runtime.close()
        if pod_id:
            async with launcher.channel() as channel:
                await remove_pod_quietly(V1, channel, pod_id)
