"""Issue 2 and 3 against a real containerd 1.6: the proxy answers exactly as
containerd does, in CRI v1 and v1alpha2, natively and translated."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc import aio

from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.host.crispec import container_config, pod_sandbox_config
from runtimeproxy.host.images import BUSYBOX_IMAGE

from .crihelpers import APIS, V1, V1ALPHA2, CriApi
from .proxyfixtures import ProxyLauncher
from .registry import LoopbackRegistry
from .test_localruntime import remove_pod_quietly

api_params = pytest.mark.parametrize("api", APIS, ids=lambda a: a.version)


async def raw(channel: aio.Channel, api: CriApi, service: str, method: str, request: bytes) -> bytes:
    return await channel.unary_unary(f"/runtime.{api.version}.{service}/{method}")(request, timeout=30)


async def same_bytes(direct: aio.Channel, proxied: aio.Channel, api: CriApi, method: str, request, service: str = "RuntimeService") -> bytes:
    """The proxy's answer is byte-identical to containerd's for a read call."""
    body = request.SerializeToString()
    via_proxy = await raw(proxied, api, service, method, body)
    straight = await raw(direct, api, service, method, body)
    assert via_proxy == straight, f"{method}: proxy and containerd differ"
    return via_proxy


async def same_items(direct, proxied, api, method, request, response_type, field, service="RuntimeService") -> None:
    """For list calls, whose order containerd does not fix: the same items."""
    body = request.SerializeToString()
    answers = [response_type.FromString(await raw(ch, api, service, method, body)) for ch in (proxied, direct)]
    via_proxy, straight = (sorted(m.SerializeToString() for m in getattr(a, field)) for a in answers)
    assert via_proxy == straight, f"{method}: proxy and containerd differ"


@api_params
async def test_lifecycle_through_proxy_equals_direct(cri_channel, proxy_channel, api: CriApi, pod_log_dir: Path) -> None:
    rt, pb = api.runtime(proxy_channel), api.pb
    version = await same_bytes(cri_channel, proxy_channel, api, "Version", pb.VersionRequest(version=api.version))
    assert pb.VersionResponse.FromString(version).runtime_api_version == api.version
    await same_bytes(cri_channel, proxy_channel, api, "ImageStatus", pb.ImageStatusRequest(image=pb.ImageSpec(image=BUSYBOX_IMAGE)), "ImageService")
    await same_items(cri_channel, proxy_channel, api, "ListImages", pb.ListImagesRequest(), pb.ListImagesResponse, "images", "ImageService")
    # Go encodes maps in random order: compare the decoded answer.
    answers = [
        pb.StatusResponse.FromString(await raw(ch, api, "RuntimeService", "Status", pb.StatusRequest(verbose=True).SerializeToString()))
        for ch in (proxy_channel, cri_channel)
    ]
    assert answers[0] == answers[1] and answers[0].info

    pod_config = pod_sandbox_config(pb, pod_log_dir)
    pod_id = (await rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_config), timeout=60)).pod_sandbox_id
    try:
        await same_bytes(cri_channel, proxy_channel, api, "PodSandboxStatus", pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True))
        created = await rt.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config(pb), sandbox_config=pod_config), timeout=60
        )
        cid = created.container_id
        await rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
        status = pb.ContainerStatusResponse.FromString(
            await same_bytes(cri_channel, proxy_channel, api, "ContainerStatus", pb.ContainerStatusRequest(container_id=cid, verbose=True))
        )
        assert status.status.state == pb.CONTAINER_RUNNING
        only_this = pb.ListContainersRequest(filter=pb.ContainerFilter(pod_sandbox_id=pod_id))
        listed = pb.ListContainersResponse.FromString(await same_bytes(cri_channel, proxy_channel, api, "ListContainers", only_this))
        assert [c.id for c in listed.containers] == [cid]
        await same_bytes(cri_channel, proxy_channel, api, "ListPodSandbox", pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(id=pod_id)))
        # Stats are live numbers: the same container, described the same way.
        stats = [
            pb.ContainerStatsResponse.FromString(await raw(ch, api, "RuntimeService", "ContainerStats", pb.ContainerStatsRequest(container_id=cid).SerializeToString()))
            for ch in (proxy_channel, cri_channel)
        ]
        assert stats[0].stats.attributes == stats[1].stats.attributes
        assert stats[0].stats.attributes.id == cid

        executed = await rt.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=["echo", "through the proxy"], timeout=10), timeout=20)
        assert (executed.exit_code, executed.stdout) == (0, b"through the proxy\n")
        failed = await rt.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=["sh", "-c", "exit 3"], timeout=10), timeout=20)
        assert failed.exit_code == 3
        # Exec (streaming URL) answers like containerd: a URL on its streaming server.
        exec_url = await rt.Exec(pb.ExecRequest(container_id=cid, cmd=["true"], stdout=True), timeout=20)
        assert exec_url.url.startswith("http://")

        await rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=10), timeout=30)
        stopped = await rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=10)
        assert stopped.status.state == pb.CONTAINER_EXITED
        await rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=30)
        # Errors pass through exactly: code and message.
        with pytest.raises(aio.AioRpcError) as via_proxy:
            await rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=10)
        with pytest.raises(aio.AioRpcError) as straight:
            await api.runtime(cri_channel).ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=10)
        assert via_proxy.value.code() == straight.value.code() == grpc.StatusCode.NOT_FOUND
        assert via_proxy.value.details() == straight.value.details()

        await rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
        await rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
        pods = await rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10)
        assert pod_id not in {p.id for p in pods.items}
    finally:
        await remove_pod_quietly(api, cri_channel, pod_id)


@api_params
async def test_pull_image_through_proxy(cri_channel, proxy_channel, registry: LoopbackRegistry, api: CriApi) -> None:
    images, pb = api.images(proxy_channel), api.pb
    spec = pb.ImageSpec(image=registry.ref())
    pulled = await images.PullImage(pb.PullImageRequest(image=spec), timeout=60)
    try:
        status = await same_bytes(cri_channel, proxy_channel, api, "ImageStatus", pb.ImageStatusRequest(image=spec), "ImageService")
        assert pb.ImageStatusResponse.FromString(status).image.id == pulled.image_ref
    finally:
        await images.RemoveImage(pb.RemoveImageRequest(image=spec), timeout=30)


# containerd 1.6 has no GetContainerEvents; 1.7 streams events (see the report of issue 13).
@pytest.mark.parametrize("containerd", ["1.6"], indirect=True)
async def test_get_container_events_unimplemented_like_containerd(cri_channel, proxy_channel) -> None:
    path = "/runtime.v1.RuntimeService/GetContainerEvents"
    results = []
    for channel in (proxy_channel, cri_channel):
        with pytest.raises(aio.AioRpcError) as err:
            async for _ in channel.unary_stream(path)(b"", timeout=10):
                pass
        results.append((err.value.code(), err.value.details()))
    assert results[0] == results[1]
    assert results[0][0] == grpc.StatusCode.UNIMPLEMENTED


async def test_backend_absent_then_present(own_containerd: LocalContainerd) -> None:
    """The proxy listens at once, answers UNAVAILABLE, then serves without a restart."""
    import contextlib

    async with contextlib.AsyncExitStack() as stack:
        launcher = ProxyLauncher(own_containerd.socket, stack)
        running, _ = await launcher.start(wait=False, probe_max_interval=0.5)
        async with launcher.channel() as channel:
            with pytest.raises(aio.AioRpcError) as err:
                await V1.runtime(channel).Version(V1.pb.VersionRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            await own_containerd.start(timeout=60, images=False)
            await running.proxy.wait_ready(30)
            for api in APIS:
                answer = await api.runtime(channel).Version(api.pb.VersionRequest(), timeout=10)
                assert answer.runtime_api_version == api.version
            # containerd restarts: the proxy reconnects and serves again.
            changed = asyncio.Event()
            running.proxy.backend.on_change(lambda info: changed.set())
            await own_containerd.stop()
            await own_containerd.start(timeout=60, images=False)
            await asyncio.wait_for(changed.wait(), 30)  # re-probed after the reconnect
            answer = await V1.runtime(channel).Version(V1.pb.VersionRequest(), timeout=10)
            assert answer.runtime_name == "containerd"


@pytest.mark.parametrize(
    ("client", "backend_version"), [(V1ALPHA2, "v1"), (V1, "v1alpha2")], ids=["v1alpha2-client-to-v1", "v1-client-to-v1alpha2"]
)
async def test_translated_lifecycle(cri_channel, launcher: ProxyLauncher, client: CriApi, backend_version: str, pod_log_dir: Path) -> None:
    """containerd 1.6 stands in for a v1-only (2.x) or a v1alpha2-only (1.5) runtime."""
    running, _ = await launcher.start(backend_version=backend_version, serve_versions="v1,v1alpha2")
    assert running.proxy.router.plan is not None
    assert running.proxy.router.plan.routes[client.version] == backend_version
    pb = client.pb
    async with launcher.channel() as channel:
        rt = client.runtime(channel)
        assert (await rt.Version(pb.VersionRequest(), timeout=10)).runtime_name == "containerd"
        pod_config = pod_sandbox_config(pb, pod_log_dir)
        pod_id = (await rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_config), timeout=60)).pod_sandbox_id
        try:
            config = container_config(pb)
            config.envs.add(key="GREETING", value=b"hello" if client is V1 else "hello")
            cid = (await rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config), timeout=60)).container_id
            await rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
            out = await rt.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=["sh", "-c", "echo $GREETING"], timeout=10), timeout=20)
            assert out.stdout == b"hello\n"
            status = await rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=10)
            assert status.status.state == pb.CONTAINER_RUNNING
            await rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=10), timeout=30)
            await rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=30)
            await rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
            await rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
            if client is V1:
                # A v1 field a v1alpha2 runtime would drop is refused, not lost.
                refused = container_config(pb)
                refused.linux.security_context.supplemental_groups_policy = pb.Strict
                with pytest.raises(aio.AioRpcError) as err:
                    await rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=refused, sandbox_config=pod_config), timeout=30)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "supplemental_groups_policy" in err.value.details()
                with pytest.raises(aio.AioRpcError) as err:
                    async for _ in channel.unary_stream("/runtime.v1.RuntimeService/GetContainerEvents")(b"", timeout=10):
                        pass
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
                assert "v1alpha2" in err.value.details()
        finally:
            await remove_pod_quietly(V1, cri_channel, pod_id)
