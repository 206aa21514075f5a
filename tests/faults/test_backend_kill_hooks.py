"""containerd 1.6 SIGKILLed while kubelet retries RunPodSandbox through the
proxy, on a connection the proxy relayed before the kill: no PreRunPodSandbox
hook is asked about a pod while containerd is away, nor while it is back but
not initialised yet, and once it serves the pod is made with its hook asked
(runtime-proxy's cripath/unreachable.py and unready.py).

Both are guards against a real containerd, end to end: neither tells the
idle/connecting gate (cripath/unreachable.py) from the TRANSIENT_FAILURE-only
one it replaced (the component tests test_runtime_outage_gate.py do)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.host.crispec import pod_sandbox_config

from ..hookprocs import hook_server, registered
from ..integration.conftest import require_local_containerd
from ..integration.containerd17 import containerd17_bin_dir
from ..integration.proxyfixtures import ProxyLauncher
from .test_backend_kill import sigkill

OUTAGE_S = 3.0  # kubelet's retries while containerd is away


async def attempt(rt: v1_grpc.RuntimeServiceStub, log_dir: Path, name: str) -> tuple[str, str]:
    """A RunPodSandbox of a pod named ``name``-...: its pod's name and outcome (OK, or code: details)."""
    config = pod_sandbox_config(v1, log_dir, name=name)
    try:
        await rt.RunPodSandbox(v1.RunPodSandboxRequest(config=config), timeout=30)
    except aio.AioRpcError as err:
        return config.metadata.name, f"{err.code().name}: {err.details()}"
    return config.metadata.name, "OK"


@pytest_asyncio.fixture(params=["1.6", "1.7"])
async def either_containerd(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LocalContainerd]:
    """A containerd of the test's own, not started: Debian's 1.6 or the shared
    1.7 (both answer UNKNOWN "server is not initialized yet" while their CRI
    plugin loads)."""
    require_local_containerd()
    bin_dir = containerd17_bin_dir() if request.param == "1.7" else None
    runtime = LocalContainerd(tmp_path / "containerd", bin_dir=bin_dir)
    yield runtime
    await runtime.stop()


async def test_no_hook_is_asked_while_containerd_is_killed_and_the_first_pod_after_has_its_hook(
    either_containerd: LocalContainerd, pod_log_dir: Path
) -> None:
    """An end-to-end guard: it passes with the TRANSIENT_FAILURE-only gate too,
    and fails with no gate at all (hooks asked about pods never made). Out of
    its scope: a call in the moment after the kill, before the proxy's channel
    has read the connection's end, passes the gate and its hook is asked."""
    own_containerd = either_containerd
    await own_containerd.start(timeout=60)
    async with contextlib.AsyncExitStack() as stack:
        launcher = ProxyLauncher(own_containerd.socket, stack)
        running, _ = await launcher.start(probe_max_interval=0.5)
        hook = await stack.enter_async_context(hook_server(launcher.dir, "rec", {}))
        hook.register(launcher.hook_dir, ["PreRunPodSandbox"], "Fail", timeout="5s")
        await registered(running, 1)
        channel = await stack.enter_async_context(launcher.channel())
        rt = v1_grpc.RuntimeServiceStub(channel)
        await rt.Version(v1.VersionRequest(), timeout=10)  # the client's connection is relayed
        await sigkill(own_containerd)
        # The proxy's runtime channel may read READY a moment after the kill
        # (its connection's end not read yet): await the proxy seeing it, as
        # kubelet's next retry would meet it.
        runtime_channel = running.proxy.backend.runtime_channel
        if runtime_channel.get_state() is grpc.ChannelConnectivity.READY:
            await asyncio.wait_for(runtime_channel.wait_for_state_change(grpc.ChannelConnectivity.READY), 10)
        loop = asyncio.get_running_loop()
        during: list[tuple[str, str]] = []
        end = loop.time() + OUTAGE_S
        while loop.time() < end:
            during.append(await attempt(rt, pod_log_dir, f"down{len(during)}"))
        assert hook.requests("PreRunPodSandbox") == [], during
        assert during and all(outcome.startswith("UNAVAILABLE") for _, outcome in during), during
        await own_containerd.start(timeout=60, images=False)
        after: list[tuple[str, str]] = []
        async with asyncio.timeout(60):
            while not after or after[-1][1] != "OK":
                after.append(await attempt(rt, pod_log_dir, f"up{len(after)}"))
        asked = {request["pod_meta"]["name"] for request in hook.requests("PreRunPodSandbox")}
        # Asked only about the pod made: while containerd's CRI plugin loaded
        # its state (every call UNKNOWN "server is not initialized yet"), the
        # proxy refused the calls before their hooks (cripath/unready.py).
        assert asked == {after[-1][0]}, (after, asked)
        refused = [outcome for _, outcome in after[:-1]]
        assert all(o.startswith("UNAVAILABLE") and "no hook server was asked" in o for o in refused), after


async def test_a_pod_whose_hook_is_asked_as_containerd_is_killed_is_not_made_and_the_next_one_is(
    own_containerd: LocalContainerd, pod_log_dir: Path
) -> None:
    """containerd dies while a RunPodSandbox's PreRunPodSandbox hook answers: the
    call fails UNAVAILABLE without reaching it (on the frames path its hook
    stage is stopped as the runtime's connection closes), and kubelet's next
    RunPodSandbox on the same connection, once containerd is back, makes the pod.
    A guard for behaviour already on main before the gate's change: the call's
    stages are cancelled when the runtime's connection closes (runtimegone.py;
    on grpc, its runtime call fails)."""
    await own_containerd.start(timeout=60)
    async with contextlib.AsyncExitStack() as stack:
        launcher = ProxyLauncher(own_containerd.socket, stack)
        running, _ = await launcher.start(probe_max_interval=0.5)
        hook = await stack.enter_async_context(hook_server(launcher.dir, "slow", {"PreRunPodSandbox": {"delay": 2}}))
        hook.register(launcher.hook_dir, ["PreRunPodSandbox"], "Fail", timeout="5s")
        await registered(running, 1)
        channel = await stack.enter_async_context(launcher.channel())
        rt = v1_grpc.RuntimeServiceStub(channel)
        killed = asyncio.ensure_future(attempt(rt, pod_log_dir, "killed"))
        await hook.received("PreRunPodSandbox")
        await sigkill(own_containerd)
        name, outcome = await killed
        assert outcome.startswith("UNAVAILABLE"), outcome
        await own_containerd.start(timeout=60, images=False)
        after: list[tuple[str, str]] = []
        async with asyncio.timeout(60):
            while not after or after[-1][1] != "OK":
                after.append(await attempt(rt, pod_log_dir, f"up{len(after)}"))
        async with aio.insecure_channel(own_containerd.address) as direct:
            pods = await v1_grpc.RuntimeServiceStub(direct).ListPodSandbox(v1.ListPodSandboxRequest(), timeout=10)
        made = {pod.metadata.name for pod in pods.items}
        assert name not in made and after[-1][0] in made, (after, made)
