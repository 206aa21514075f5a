"""The proxy's records of pods and containers: what hooks are sent from them,
and how they stay right when a client leaves or the proxy shuts down mid-call."""

from __future__ import annotations

import asyncio
import contextlib
import json

import grpc
import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.app import build_proxy
from runtimeproxy.config import ProxyConfig

from ...hookprocs import hook_server, registered
from .crirequests import (
    CREATE,
    POD_STATUS,
    REMOVE,
    RUN_POD,
    START,
    STOP,
    UPDATE,
    create_request,
    records_kept,
    sandbox_config,
)


async def test_state_flows_from_create_to_later_hooks_and_is_dropped(running, fake, client, sock_dir, hook_dir) -> None:
    watcher = {"PreStartContainer": {}, "PreUpdateContainerResources": {"container_resources": {"cpu_quota": 5000}}}
    async with hook_server(sock_dir, "watcher", watcher) as hook:
        hook.register(hook_dir, ["PreStartContainer", "PreUpdateContainerResources"])
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        await client.unary_unary(START)(v1.StartContainerRequest(container_id="ctr-1").SerializeToString())
        seen = hook.requests("PreStartContainer")[0]
        assert seen["container_meta"] == {"name": "app", "attempt": 1, "id": "ctr-1"}
        assert seen["pod_labels"] == {"app": "web"}
        assert seen["container_envs"] == {"KEEP": "original"}
        update = v1.UpdateContainerResourcesRequest(
            container_id="ctr-1", linux=v1.LinuxContainerResources(cpu_period=100000, cpu_quota=90000)
        )
        await client.unary_unary(UPDATE)(update.SerializeToString())
        sent = v1.UpdateContainerResourcesRequest.FromString(fake.calls(UPDATE)[0].requests[0])
        assert (sent.linux.cpu_period, sent.linux.cpu_quota) == (100000, 5000)
        assert hook.requests("PreUpdateContainerResources")[0]["container_resources"]["cpu_quota"] == "90000"
        assert "ctr-1" in running.store.containers
        await client.unary_unary(REMOVE)(v1.RemoveContainerRequest(container_id="ctr-1").SerializeToString())
        assert "ctr-1" not in running.store.containers


async def test_an_update_changes_only_what_it_sets_in_the_record(running, fake, client, sock_dir, hook_dir) -> None:
    """kubelet's CPU manager updates the cpuset alone: the runtime keeps the
    container's limits, so later hooks are told of them too."""
    watcher = {"PreUpdateContainerResources": {}, "PostStopContainer": {}}
    async with hook_server(sock_dir, "watcher", watcher) as hook:
        hook.register(hook_dir, ["PreUpdateContainerResources", "PostStopContainer"])
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        update = v1.UpdateContainerResourcesRequest(container_id="ctr-1", linux=v1.LinuxContainerResources(cpuset_cpus="0"))
        await client.unary_unary(UPDATE)(update.SerializeToString())
        await client.unary_unary(STOP)(v1.StopContainerRequest(container_id="ctr-1").SerializeToString())
        await running.hooks.drain()
        stopped = hook.requests("PostStopContainer")[0]["container_resources"]
    assert stopped == {"cpuset_cpus": "0", "cpu_shares": "256", "memory_limit_in_bytes": str(1 << 30)}
    res = running.store.containers["ctr-1"].container_resources
    assert (res.cpuset_cpus, res.cpu_shares, res.memory_limit_in_bytes) == ("0", 256, 1 << 30)


async def test_records_are_what_the_last_pre_hook_saw_when_it_changed_nothing(
    running, fake, client, sock_dir, hook_dir
) -> None:
    """The record a pre hook was sent is kept, not built again, unless its answer changed the call."""
    from google.protobuf import json_format

    from cri_api.hookapi import api_pb2 as hookapi

    changer = {"PreCreateContainer": {"container_annotations": {"hooked-by": "a"}}}
    async with hook_server(sock_dir, "a", changer) as a, hook_server(sock_dir, "b", {}) as b:
        a.register(hook_dir, ["PreCreateContainer"], priority=1)
        b.register(hook_dir, ["PreRunPodSandbox", "PreCreateContainer"], priority=2)
        await registered(running, 2)
        await client.unary_unary(RUN_POD)(v1.RunPodSandboxRequest(config=sandbox_config()).SerializeToString())
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        seen_pod = json_format.ParseDict(b.requests("PreRunPodSandbox")[0], hookapi.PodSandboxHookRequest())
        seen_container = json_format.ParseDict(
            b.requests("PreCreateContainer")[0], hookapi.ContainerResourceHookRequest()
        )
    assert running.store.pods["pod-1"] == seen_pod
    assert seen_container.container_annotations["hooked-by"] == "a"  # a's change, which b saw
    seen_container.container_meta.id = "ctr-1"
    assert running.store.containers["ctr-1"] == seen_container


async def test_a_call_whose_client_left_while_its_state_was_read_is_still_recorded(
    running, fake, client, sock_dir, hook_dir
) -> None:
    """The runtime created a container in a pod the proxy had no record of (run while it was
    down), and the client's deadline passed while the proxy read that pod back: the container's
    record is still kept, with the pod as the runtime has it, because the container exists."""
    info = {"config": {"metadata": {"name": "old", "uid": "uid-7", "namespace": "default"}, "labels": {"tier": "batch"}}}
    status = v1.PodSandboxStatusResponse(info={"info": json.dumps(info)}).SerializeToString()
    fake.script(POD_STATUS, response=status, hang=True)
    request = create_request()
    request.pod_sandbox_id = "pod-7"
    async with records_kept(running, sock_dir, hook_dir):
        with pytest.raises(aio.AioRpcError) as err:
            await client.unary_unary(CREATE)(request.SerializeToString(), timeout=0.5)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert len(fake.calls(CREATE)) == 1  # the runtime got it and answered
        await asyncio.wait_for(fake.cancel_seen.wait(), 5)
        assert fake.cancelled == [POD_STATUS]  # the read under way ended with the client's call
        await fake.wait_calls(POD_STATUS, 2)  # and was started again, in the background
        fake.scripts[POD_STATUS].release.set()
        await running.hooks.drain()
        record = running.store.containers["ctr-1"]
        assert (record.container_meta.name, record.container_meta.id) == ("app", "ctr-1")
        assert (record.pod_meta.uid, dict(record.pod_labels)) == ("uid-7", {"tier": "batch"})
        assert running.store.container_pod["ctr-1"] == "pod-7"
        assert len(running.hooks.locks) == 0


async def test_shutdown_finishes_recording_a_call_the_runtime_answered(fake, sock_dir, hook_dir) -> None:
    """SIGTERM while a created container's pod is being read back: the grace period ends the
    client's call, but the proxy still records the container, with the runtime's pod, before it
    closes its backend channel."""
    fake.script(CREATE, response=v1.CreateContainerResponse(container_id="ctr-1").SerializeToString())
    info = {"config": {"metadata": {"name": "old", "uid": "uid-7", "namespace": "default"}}}
    fake.script(POD_STATUS, response=v1.PodSandboxStatusResponse(info={"info": json.dumps(info)}).SerializeToString(), hang=True)
    request = create_request()
    request.pod_sandbox_id = "pod-7"
    config = ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, hook_dir=hook_dir, grace_period=0.3)
    stack = contextlib.AsyncExitStack()
    running = await build_proxy(config, stack)
    try:
        await running.proxy.wait_ready(10)
        # Its server stops before the proxy (the stack unwinds in reverse); its
        # registration stays, so the calls are recorded to the end.
        await stack.enter_async_context(records_kept(running, sock_dir, hook_dir))
        async with aio.insecure_channel(f"unix://{config.listen}") as channel:
            call = channel.unary_unary(CREATE)(request.SerializeToString(), timeout=30)
            await fake.wait_calls(POD_STATUS)  # the runtime answered; the proxy reads the pod back
            stopping = asyncio.ensure_future(stack.aclose())
            with pytest.raises(aio.AioRpcError):
                await call  # the grace period is over
            assert not stopping.done()  # but shutdown waits for the record
            fake.scripts[POD_STATUS].release.set()
            await asyncio.wait_for(stopping, 15)
    finally:
        await stack.aclose()
    assert running.store.containers["ctr-1"].pod_meta.uid == "uid-7"


async def test_a_removal_whose_client_left_is_checked_with_the_runtime(
    running, fake, client, sock_dir, hook_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client gives up on RemovePodSandbox while the runtime is still at it:
    the proxy never sees the answer, asks the runtime again, and forgets the pod
    once the runtime says it is gone."""
    from runtimeproxy.hookpath import store as store_module

    monkeypatch.setattr(store_module, "RECHECK_DELAYS_S", (0.05, 0.05))
    remove_pod = "/runtime.v1.RuntimeService/RemovePodSandbox"
    async with records_kept(running, sock_dir, hook_dir):
        await client.unary_unary(RUN_POD)(v1.RunPodSandboxRequest(config=sandbox_config()).SerializeToString())
        assert "pod-1" in running.hooks.store.pods
        fake.script(remove_pod, hang=True)
        fake.script(POD_STATUS, code=grpc.StatusCode.NOT_FOUND, details="no such sandbox")
        with pytest.raises(aio.AioRpcError) as err:
            await client.unary_unary(remove_pod)(
                v1.RemovePodSandboxRequest(pod_sandbox_id="pod-1").SerializeToString(), timeout=0.3
            )
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await fake.wait_calls(remove_pod)
        async with asyncio.timeout(10):
            while not running.hooks._rechecks:  # noqa: SLF001, ASYNC110 - the handler notices the client left; no event for a recheck starting; bounded
                await asyncio.sleep(0.01)
            await running.hooks.rechecked()
        assert "pod-1" not in running.hooks.store.pods
        fake.scripts[remove_pod].release.set()


async def test_pre_update_shows_the_container_as_updated_and_applies_only_what_the_hook_changed(
    running, fake, client, sock_dir, hook_dir
) -> None:
    """As Koordinator: the hook sees the container's resources with the
    update's merged in (a CPU manager's cpuset-only update still shows the
    limits). What it echoes stays out of the update: the container's swap
    carried into an update raising its memory limit would fail in runc."""
    answer = {"container_resources": {"memory_swap_limit_in_bytes": 2 << 30, "cpu_quota": 5000}}
    async with hook_server(sock_dir, "update", {"PreUpdateContainerResources": answer}) as hook:
        hook.register(hook_dir, ["PreUpdateContainerResources"])
        await registered(running, 1)
        create = create_request()
        create.config.linux.resources.memory_swap_limit_in_bytes = 2 << 30
        await client.unary_unary(CREATE)(create.SerializeToString())
        update = v1.UpdateContainerResourcesRequest(container_id="ctr-1", linux=v1.LinuxContainerResources(cpuset_cpus="2-3"))
        await client.unary_unary(UPDATE)(update.SerializeToString(), timeout=5)
        (seen,) = hook.requests("PreUpdateContainerResources")
    shown = seen["container_resources"]
    assert shown["cpuset_cpus"] == "2-3" and shown["cpu_shares"] == "256"
    assert (shown["memory_limit_in_bytes"], shown["memory_swap_limit_in_bytes"]) == (str(1 << 30), str(2 << 30))
    sent = v1.UpdateContainerResourcesRequest.FromString(fake.calls(UPDATE)[0].requests[0])
    assert sent.linux == v1.LinuxContainerResources(cpuset_cpus="2-3", cpu_quota=5000)
    record = running.store.containers["ctr-1"].container_resources
    assert (record.cpuset_cpus, record.cpu_quota, record.memory_swap_limit_in_bytes) == ("2-3", 5000, 2 << 30)
