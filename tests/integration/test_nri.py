"""Issue 13 end to end: ``runtime-proxy nri`` on a real containerd 1.7.13 with
NRI enabled, driven through CRI directly (no proxy in the path). Values are
read where they land: the container's cgroup and its OCI spec."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from grpc import aio

from hooks.sdk import write_hook_config
from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.host.crispec import container_config, pod_sandbox_config

from ..component import conftest as component
from ..hookprocs import hook_server
from . import nrihelpers
from .batchhelpers import PodCgroup, batchresource_hook
from .conftest import NRI_REQUEST_TIMEOUT
from .containerd17 import containerd17_bin_dir
from .crihelpers import V1, cgroup_of, verbose_info
from .nrihelpers import nri_plugin
from .test_batchresource import BE, MIB, batch, container_values, pod_values, spec
from .test_localruntime import remove_pod_quietly

hook_dir = component.hook_dir  # the proxy's hook tests' fixture, under sock_dir

pb = V1.pb
# Only against the session's containerd 1.7.13 (the one with NRI).
ON_CONTAINERD17 = pytest.mark.parametrize("containerd", ["1.7"], indirect=True)
QUOTA_HOOK = {
    "PreCreateContainer": {
        "container_resources": {"cpu_period": 100000, "cpu_quota": 20000, "memory_limit_in_bytes": 64 * MIB},
        "container_annotations": {"hooked-by": "quota"},
        "container_envs": {"HOOKED": "1"},
    }
}


@pytest.fixture
def sock_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("n", numbered=True)  # short: unix socket paths


@pytest.fixture
async def cri17(containerd) -> AsyncIterator[aio.Channel]:
    async with aio.insecure_channel(containerd.address) as channel:
        yield channel


@contextlib.asynccontextmanager
async def a_pod(channel: aio.Channel, log_dir: Path, **kwargs: object) -> AsyncIterator[tuple[str, object]]:
    config = pod_sandbox_config(pb, log_dir, **kwargs)
    pod_id = (await V1.runtime(channel).RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60)).pod_sandbox_id
    try:
        yield pod_id, config
    finally:
        await remove_pod_quietly(V1, channel, pod_id)


async def create(channel: aio.Channel, pod_id: str, config: object, name: str = "sleeper") -> str:
    request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config(pb, name=name), sandbox_config=config)
    return (await V1.runtime(channel).CreateContainer(request, timeout=60)).container_id


async def start(channel: aio.Channel, cid: str) -> int:
    await V1.runtime(channel).StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
    status = await V1.runtime(channel).ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True), timeout=10)
    return int(verbose_info(status)["pid"])


async def oci_spec(channel: aio.Channel, cid: str) -> dict:
    status = await V1.runtime(channel).ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True), timeout=10)
    return verbose_info(status)["runtimeSpec"]


def quota_of(pid: int) -> int:
    return int((cgroup_of(pid, "cpu") / "cpu.cfs_quota_us").read_text())


@ON_CONTAINERD17
async def test_hook_answer_lands_in_cgroup_and_spec(containerd, cri17, sock_dir, hook_dir, pod_log_dir) -> None:
    async with hook_server(sock_dir, "quota", QUOTA_HOOK) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        async with nri_plugin(containerd, hook_dir), a_pod(cri17, pod_log_dir, labels={"app": "web"}) as (pod_id, config):
            cid = await create(cri17, pod_id, config)
            pid = await start(cri17, cid)
            assert quota_of(pid) == 20000
            assert int((cgroup_of(pid, "memory") / "memory.limit_in_bytes").read_text()) == 64 * MIB
            spec_ = await oci_spec(cri17, cid)
            assert "HOOKED=1" in spec_["process"]["env"]
            assert spec_["annotations"]["hooked-by"] == "quota"
            seen = hook.requests("PreCreateContainer")[0]
            assert seen["pod_labels"]["app"] == "web"
            assert seen["pod_meta"]["uid"] == config.metadata.uid


@ON_CONTAINERD17
async def test_update_is_rewritten_by_pre_update(containerd, cri17, sock_dir, hook_dir, pod_log_dir) -> None:
    script = {"PreUpdateContainerResources": {"container_resources": {"cpu_quota": 30000}}}
    async with hook_server(sock_dir, "upd", script) as hook:
        hook.register(hook_dir, ["PreUpdateContainerResources"])
        async with nri_plugin(containerd, hook_dir), a_pod(cri17, pod_log_dir) as (pod_id, config):
            cid = await create(cri17, pod_id, config)
            pid = await start(cri17, cid)
            wanted = pb.LinuxContainerResources(cpu_period=100000, cpu_quota=50000)
            await V1.runtime(cri17).UpdateContainerResources(
                pb.UpdateContainerResourcesRequest(container_id=cid, linux=wanted), timeout=30
            )
            assert quota_of(pid) == 30000
            assert hook.requests("PreUpdateContainerResources")[0]["container_resources"]["cpu_quota"] == "50000"


@ON_CONTAINERD17
async def test_fail_hook_whose_server_is_down_refuses_the_container(containerd, cri17, sock_dir, hook_dir, pod_log_dir) -> None:
    write_hook_config(hook_dir, "down", sock_dir / "nobody.sock", ["PreCreateContainer"], "Fail", "1s", None)
    async with nri_plugin(containerd, hook_dir), a_pod(cri17, pod_log_dir) as (pod_id, config):
        with pytest.raises(aio.AioRpcError) as refused:
            await create(cri17, pod_id, config)
        assert "hook server down" in refused.value.details() and "failure-policy Fail" in refused.value.details()
        listed = await V1.runtime(cri17).ListContainers(
            pb.ListContainersRequest(filter=pb.ContainerFilter(pod_sandbox_id=pod_id)), timeout=10
        )
        assert not listed.containers
    # An Ignore hook that is down does not stop anything.
    write_hook_config(hook_dir, "down", sock_dir / "nobody.sock", ["PreCreateContainer"], "Ignore", "1s", None)
    async with nri_plugin(containerd, hook_dir), a_pod(cri17, pod_log_dir) as (pod_id, config):
        await start(cri17, await create(cri17, pod_id, config))


@ON_CONTAINERD17
async def test_chained_servers_apply_in_order(containerd, cri17, sock_dir, hook_dir, pod_log_dir) -> None:
    first = {"PreCreateContainer": {"container_resources": {"cpu_period": 100000, "cpu_quota": 10000},
                                    "container_envs": {"X": "first"}}}
    second = {"PreCreateContainer": {"container_envs": {"X": "second"}}}
    async with hook_server(sock_dir, "a", first) as a, hook_server(sock_dir, "b", second) as b:
        a.register(hook_dir, ["PreCreateContainer"], priority=1)
        b.register(hook_dir, ["PreCreateContainer"], priority=2)
        async with nri_plugin(containerd, hook_dir), a_pod(cri17, pod_log_dir) as (pod_id, config):
            cid = await create(cri17, pod_id, config)
            pid = await start(cri17, cid)
            env = (await oci_spec(cri17, cid))["process"]["env"]
            assert "X=second" in env and "X=first" not in env
            assert quota_of(pid) == 10000
            assert b.requests("PreCreateContainer")[0]["container_envs"]["X"] == "first"


@ON_CONTAINERD17
async def test_restarted_plugin_picks_up_existing_pods(containerd, cri17, sock_dir, hook_dir, pod_log_dir) -> None:
    script = {"PreUpdateContainerResources": {"container_resources": {"cpu_quota": 30000}}}
    async with hook_server(sock_dir, "upd", script) as hook, contextlib.AsyncExitStack() as stack:
        hook.register(hook_dir, ["PreUpdateContainerResources"])
        async with nri_plugin(containerd, hook_dir):
            pod_id, config = await stack.enter_async_context(
                a_pod(cri17, pod_log_dir, labels={"team": "a"}, annotations={"note": "n"})
            )
        # The plugin is gone; a container is made without it.
        cid = await create(cri17, pod_id, config)
        pid = await start(cri17, cid)
        async with nri_plugin(containerd, hook_dir) as plugin:
            assert pod_id in plugin.store.pods and cid in plugin.store.containers  # from Synchronize
            wanted = pb.LinuxContainerResources(cpu_period=100000, cpu_quota=50000)
            await V1.runtime(cri17).UpdateContainerResources(
                pb.UpdateContainerResourcesRequest(container_id=cid, linux=wanted), timeout=30
            )
            assert quota_of(pid) == 30000
        seen = hook.requests("PreUpdateContainerResources")[0]
        assert seen["pod_labels"]["team"] == "a" and seen["pod_annotations"]["note"] == "n"
        assert seen["pod_meta"]["uid"] == config.metadata.uid and seen["container_meta"]["id"] == cid


@ON_CONTAINERD17
async def test_be_pod_gets_its_batch_limits_through_nri(containerd, cri17, tmp_path, hook_dir, pod_log_dir) -> None:
    """The same pod and values as test_batchresource's proxy test, through NRI."""
    async with batchresource_hook(tmp_path, hook_dir, reconcile_interval="200ms"), nri_plugin(containerd, hook_dir):
        config = pod_sandbox_config(pb, pod_log_dir, name="batch", labels=BE, annotations=spec(main=batch("500", "128Mi")))
        cgroup = PodCgroup.new(config.metadata.uid)
        config.linux.cgroup_parent = cgroup.parent
        cgroup.make()  # as kubelet does, before RunPodSandbox
        pod_id = ""
        try:
            pod_id = (await V1.runtime(cri17).RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60)).pod_sandbox_id
            assert pod_values(cgroup) == (512, 50000, 128 * MIB)
            pid = await start(cri17, await create(cri17, pod_id, config, name="main"))
            assert cgroup_of(pid, "cpu").parent == cgroup.path("cpu")
            assert container_values(pid) == (512, 50000, 128 * MIB)
            assert pod_values(cgroup) == (512, 50000, 128 * MIB)
        finally:
            if pod_id:
                await remove_pod_quietly(V1, cri17, pod_id)
            await cgroup.remove()


@ON_CONTAINERD17
async def test_every_event_reaches_its_hook(containerd, cri17, sock_dir, hook_dir, pod_log_dir) -> None:
    hooks = ["PreRunPodSandbox", "PreStartContainer", "PostStartContainer", "PostStopContainer", "PostStopPodSandbox"]
    async with hook_server(sock_dir, "all", {}) as hook:
        hook.register(hook_dir, hooks)
        async with nri_plugin(containerd, hook_dir) as plugin:
            async with a_pod(cri17, pod_log_dir, labels={"app": "web"}) as (pod_id, config):
                cid = await create(cri17, pod_id, config)
                pid = await start(cri17, cid)
                await V1.runtime(cri17).StopContainer(pb.StopContainerRequest(container_id=cid, timeout=5), timeout=30)
                await V1.runtime(cri17).StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
                await plugin.stage.drain()  # post hooks run after the answer, in order
            records = hook.records()
    by_hook: dict[str, list[dict]] = {}
    for record in records:
        by_hook.setdefault(record["hook"], []).append(record["request"])
    assert list(by_hook) == hooks  # each in lifecycle order
    assert by_hook["PreRunPodSandbox"][0]["pod_meta"]["uid"] == config.metadata.uid
    assert by_hook["PreRunPodSandbox"][0]["labels"]["app"] == "web"
    for name in hooks[1:4]:
        request = by_hook[name][0]
        assert request["container_meta"]["id"] == cid and request["pod_labels"]["app"] == "web"
    assert by_hook["PostStopPodSandbox"][0]["pod_meta"]["uid"] == config.metadata.uid
    assert pid > 0


async def test_plugin_started_by_containerd(tmp_path, sock_dir, hook_dir, pod_log_dir) -> None:
    """In containerd's plugin_path: started with a pre-connected socket, and
    its hooks apply as for a plugin that connects itself."""
    runtime = LocalContainerd(tmp_path / "c17", bin_dir=containerd17_bin_dir(), nri=True, request_timeout=NRI_REQUEST_TIMEOUT)
    plugins = runtime.base / "nri-plugins"
    plugins.mkdir(parents=True)
    log = tmp_path / "plugin.log"
    script = plugins / "50-runtime-proxy"
    script.write_text(
        f"#!/bin/sh\nexec {sys.executable} -m runtimeproxy nri --hook-dir {hook_dir} "
        f"--request-timeout {NRI_REQUEST_TIMEOUT:g} --log-format json 2>>{log}\n"
    )
    script.chmod(0o755)
    async with hook_server(sock_dir, "quota", QUOTA_HOOK) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        try:
            await runtime.start()
            # containerd 1.7.13 configures the plugins it starts, but sends them no Synchronize.
            await nrihelpers.logged(log, "registered with the runtime")
            async with aio.insecure_channel(runtime.address) as channel, a_pod(channel, pod_log_dir) as (pod_id, config):
                pid = await start(channel, await create(channel, pod_id, config))
                assert quota_of(pid) == 20000
            assert len(hook.requests("PreCreateContainer")) == 1
        finally:
            await runtime.stop()
    started = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    # Its --event-loop default (auto) is uvloop, installed with the package: the plugin ran there.
    assert any(line.get("fd") == 3 and line.get("plugin") == "runtime-proxy" and line.get("event_loop") == "uvloop"
               for line in started)
