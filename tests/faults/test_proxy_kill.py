"""The proxy process SIGKILLed under 16 clients running lifecycles and reads, then restarted."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.host.process import terminate_process

from ..hookprocs import hook_server
from .workload import PRESENT, Ledger, listed, load, mismatches, progress

HOOKS = ["PreRunPodSandbox", "PreCreateContainer", "PreUpdateContainerResources", "PostStopContainer"]


@contextlib.asynccontextmanager
async def proxy_process(listen: Path, backend: Path, hook_dir: Path, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """``runtime-proxy serve`` as kubelet's node runs it, until it serves (or the block ends)."""
    with open(log, "ab") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runtimeproxy.cli", "serve", "--listen", str(listen), "--backend", str(backend),
            "--hook-dir", str(hook_dir), "--log-format", "json", stderr=out)
    try:
        async with aio.insecure_channel(f"unix://{listen}") as channel:
            # wait_for_ready: the call waits for the socket, then for SERVING (the backend probed).
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=30,
                                                            wait_for_ready=True)
        yield process
    finally:
        await terminate_process(process, 10, "runtime-proxy serve")


async def sigkill(process: asyncio.subprocess.Process) -> None:
    os.kill(process.pid, signal.SIGKILL)
    await process.wait()


async def test_proxy_sigkill_under_load(own_containerd: LocalContainerd, pod_log_dir: Path, tmp_path: Path) -> None:
    await own_containerd.start(timeout=60)
    work = Path(os.path.realpath(tmp_path))
    listen, hook_dir, log = work / "p.sock", work / "hooks.d", work / "proxy.log"
    hook_dir.mkdir(mode=0o755)
    os.chmod(hook_dir, 0o755)
    ledger = Ledger()
    async with hook_server(work, "rec", {}) as hook:
        hook.register(hook_dir, HOOKS, "Fail", timeout="5s")
        async with aio.insecure_channel(f"unix://{listen}") as channel, contextlib.AsyncExitStack() as proxies:
            stub = v1_grpc.RuntimeServiceStub(channel)
            first = await proxies.enter_async_context(proxy_process(listen, own_containerd.socket, hook_dir, log))
            async with load(stub, ledger, pod_log_dir):
                await progress(ledger, 60)
                await sigkill(first)
                before_crash = dict(ledger.ids)
                assert listen.is_socket()  # left behind by the crash
                # The second proxy is stopped only after the clients finished.
                await proxies.enter_async_context(proxy_process(listen, own_containerd.socket, hook_dir, log))
                await progress(ledger, 60)
            # Pods made before the crash and still there.
            runtime_after = await listed(stub)
            older = [(uid, ids) for uid, ids in before_crash.items()
                     if ledger.containers.get(uid) == PRESENT and uid in runtime_after.containers]
            await check_hooks_get_full_pod_data(stub, hook, older[:4])

    # What failed, failed as a call to a proxy that is not there: UNAVAILABLE.
    assert ledger.failures == []
    assert ledger.codes() <= {"UNAVAILABLE"}, ledger.outcomes
    assert ledger.count("UNAVAILABLE") > 0  # the crash did hit calls
    async with aio.insecure_channel(own_containerd.address) as direct:
        runtime = await listed(v1_grpc.RuntimeServiceStub(direct))
    assert mismatches(ledger, runtime) == []
    assert older, "no pod from before the crash survived to be checked"


POD_FIELDS = ("pod_meta", "pod_labels", "pod_annotations", "pod_cgroup_parent", "pod_resources")


async def check_hooks_get_full_pod_data(stub, hook, pods) -> None:
    """A hook on a container created before the crash sees its pod as the
    first proxy's PreCreateContainer did."""
    for uid, (_, cid, pod_config) in pods:
        await stub.UpdateContainerResources(v1.UpdateContainerResourcesRequest(
            container_id=cid, linux=v1.LinuxContainerResources(cpu_shares=300)), timeout=30)
        seen = [r for r in hook.requests("PreUpdateContainerResources") if r["container_meta"]["id"] == cid][-1]
        created = [r for r in hook.requests("PreCreateContainer") if r["pod_meta"]["uid"] == uid][-1]
        assert {k: seen.get(k) for k in POD_FIELDS} == {k: created.get(k) for k in POD_FIELDS}
        assert seen["pod_meta"]["name"] == pod_config.metadata.name
        assert seen["pod_labels"] == dict(pod_config.labels) != {}
        assert seen["pod_annotations"] == dict(pod_config.annotations) != {}
        assert seen["container_meta"]["name"] == "sleeper"
