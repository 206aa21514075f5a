"""On the frames path, a call whose stages have no work for it is relayed
verbatim (routes.py, ``StageProvider.needed``): with no hook server
registered, every call of a hooked method, the ones that keep state too,
but a resource update; its records are read again from the runtime when a
hook server comes.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from runtimeproxy.app import RunningProxy
from runtimeproxy.supervisor import TaskName

from ...hookprocs import hook_server, registered
from ..fakes import FakeBackend

START = "/runtime.v1.RuntimeService/StartContainer"
STOP = "/runtime.v1.RuntimeService/StopContainer"
STOP_POD = "/runtime.v1.RuntimeService/StopPodSandbox"
REMOVE = "/runtime.v1.RuntimeService/RemoveContainer"
RUN_POD = "/runtime.v1.RuntimeService/RunPodSandbox"
CREATE = "/runtime.v1.RuntimeService/CreateContainer"
REMOVE_POD = "/runtime.v1.RuntimeService/RemovePodSandbox"
LIST_PODS = "/runtime.v1.RuntimeService/ListPodSandbox"
UPDATE = "/runtime.v1.RuntimeService/UpdateContainerResources"
POD_STATUS = "/runtime.v1.RuntimeService/PodSandboxStatus"
CTR_STATUS = "/runtime.v1.RuntimeService/ContainerStatus"
UNKNOWN_FIELD = b"\xba\x3e\x01z"  # field 999, which no CRI message has


def staged(running: RunningProxy, method: str) -> float:
    """Calls of ``method`` that went through the hook stage."""
    value = running.metrics.registry.get_sample_value(
        "runtime_proxy_hooked_calls_total", {"method": method, "outcome": "ok"}
    )
    return value or 0.0


async def test_without_hook_servers_every_call_skips_the_stage(running, fake: FakeBackend, client) -> None:
    calls = [
        (RUN_POD, v1.RunPodSandboxRequest(config=v1.PodSandboxConfig(metadata=v1.PodSandboxMetadata(uid="u-1")))),
        (CREATE, v1.CreateContainerRequest(pod_sandbox_id="pod-1")),
        (START, v1.StartContainerRequest(container_id="ctr-1")),
        (STOP, v1.StopContainerRequest(container_id="ctr-1", timeout=5)),
        (REMOVE, v1.RemoveContainerRequest(container_id="ctr-1")),
        (STOP_POD, v1.StopPodSandboxRequest(pod_sandbox_id="pod-1")),
        (REMOVE_POD, v1.RemovePodSandboxRequest(pod_sandbox_id="pod-1")),
    ]
    for path, request in calls:
        raw = request.SerializeToString() + UNKNOWN_FIELD
        await client.unary_unary(path)(raw, timeout=10)
        assert fake.calls(path)[0].requests == [raw]  # as it came: not decoded and encoded again
    assert [staged(running, path.rsplit("/", 1)[1]) for path, _ in calls] == [0] * len(calls)
    assert running.hooks.store.pods == {} and running.hooks.store.containers == {}  # nothing recorded
    # But a resource update, which later hook requests carry: it is recorded
    # whatever comes (a read back under way is told it is stale).
    await client.unary_unary(UPDATE)(v1.UpdateContainerResourcesRequest(container_id="ctr-1").SerializeToString(),
                                     timeout=10)
    assert staged(running, "UpdateContainerResources") == 1


async def test_records_are_read_again_when_a_hook_server_comes_after_unrecorded_calls(
    running, fake: FakeBackend, client, sock_dir, hook_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = running.hooks.store
    store.put_pod("pod-old", hookapi.PodSandboxHookRequest())  # a record from before (start-up's rebuild)
    await client.unary_unary(REMOVE_POD)(v1.RemovePodSandboxRequest(pod_sandbox_id="pod-old").SerializeToString(),
                                         timeout=10)
    assert store.pods == {}  # the removal went by unrecorded: no record is kept from then on
    rebuilds: list[str] = []

    async def rebuild_quietly() -> None:
        rebuilds.append("rebuild")

    monkeypatch.setattr(store, "rebuild_quietly", rebuild_quietly)
    await asyncio.gather(*running.tasks.running(TaskName.REBUILD))  # start-up's, if still under way
    running.hooks.refresh_records()  # the runtime reconnects: nothing is read while none are kept
    assert running.tasks.running(TaskName.REBUILD) == []
    async with hook_server(sock_dir, "create", {"PreCreateContainer": {}}) as hook:
        store.put_pod("pod-stale", hookapi.PodSandboxHookRequest())  # (as if a read had just ended)
        hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        assert store.pods == {}  # forgotten when the server came: each is read back when needed
        await asyncio.gather(*running.tasks.running(TaskName.REBUILD))
        assert rebuilds == ["rebuild"]  # and all of them read again, as at start-up


async def test_with_no_hook_server_a_call_in_the_stage_neither_records_nor_reads_back(
    running, fake: FakeBackend, client
) -> None:
    """A resource update holds its container at the runtime (it takes the stage
    whatever comes), so a creation that arrives meanwhile takes it too: once
    calls went by unrecorded, it is answered as it comes, reads no pod back
    and records nothing."""
    await client.unary_unary(REMOVE)(v1.RemoveContainerRequest(container_id="ctr-0").SerializeToString(), timeout=10)
    fake.script(UPDATE, hang=True)
    updating = asyncio.ensure_future(client.unary_unary(UPDATE)(
        v1.UpdateContainerResourcesRequest(container_id="ctr-9").SerializeToString(), timeout=10))
    await fake.wait_calls(UPDATE)
    fake.script(POD_STATUS, hang=True)  # a read back would hold the answer
    create = v1.CreateContainerRequest(pod_sandbox_id="pod-1").SerializeToString()
    await client.unary_unary(CREATE)(create, timeout=5)
    assert staged(running, "CreateContainer") == 1 and fake.calls(POD_STATUS) == []
    assert running.hooks.store.containers == {}
    fake.scripts[UPDATE].release.set()
    await updating


async def test_a_hook_server_that_comes_after_recorded_calls_only_keeps_the_records(
    running, fake: FakeBackend, client, sock_dir, hook_dir
) -> None:
    store = running.hooks.store
    store.put_pod("pod-1", hookapi.PodSandboxHookRequest())
    await client.unary_unary(START)(v1.StartContainerRequest(container_id="ctr-1").SerializeToString(), timeout=10)
    async with hook_server(sock_dir, "create", {"PreCreateContainer": {}}) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
    assert "pod-1" in store.pods  # a start records nothing: no record went out of date


async def test_a_hook_server_for_any_point_puts_them_back_on_the_stage(
    running, fake: FakeBackend, client, sock_dir, hook_dir
) -> None:
    async with hook_server(sock_dir, "create", {"PreCreateContainer": {}}) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        await client.unary_unary(START)(v1.StartContainerRequest(container_id="ctr-1").SerializeToString(), timeout=10)
    assert staged(running, "StartContainer") == 1


async def test_a_start_behind_a_call_in_the_stage_waits_its_turn(
    running, fake: FakeBackend, client, sock_dir, hook_dir
) -> None:
    """A removal at the runtime holds its container: a start for it that
    arrives meanwhile, once the last hook server has gone, takes the stage
    all the same and reaches the runtime after it."""
    fake.script(REMOVE, hang=True)
    async with hook_server(sock_dir, "create", {"PreCreateContainer": {}}) as hook:
        registration = hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        removing = asyncio.ensure_future(
            client.unary_unary(REMOVE)(v1.RemoveContainerRequest(container_id="ctr-1").SerializeToString(), timeout=10)
        )
        await fake.wait_calls(REMOVE)
        registration.unlink()
        await registered(running, 0)
    starting = asyncio.ensure_future(
        client.unary_unary(START)(v1.StartContainerRequest(container_id="ctr-1").SerializeToString(), timeout=10)
    )
    async with asyncio.timeout(5):
        while running.hooks.locks.users("ctr-1") < 2:  # noqa: ASYNC110 - the lock table has no event (hot path); bounded
            await asyncio.sleep(0.01)
    assert fake.calls(START) == []
    fake.scripts[REMOVE].release.set()
    await asyncio.wait_for(asyncio.gather(removing, starting), 10)
    assert [r.path for r in fake.received if r.path in (REMOVE, START)] == [REMOVE, START]
    assert staged(running, "StartContainer") == 1


async def test_a_hook_after_unrecorded_calls_sees_the_object_as_the_runtime_has_it(
    running, fake: FakeBackend, client, sock_dir, hook_dir
) -> None:
    """A pod and its container created while no hook server was registered: the
    first hook on that container gets its record read back from the runtime."""
    pod_info = {"config": {"metadata": {"name": "web", "uid": "u-1", "namespace": "ns"}, "labels": {"app": "web"}}}
    ctr_info = {"sandboxID": "pod-1", "config": {"metadata": {"name": "app", "attempt": 1}, "annotations": {"a": "1"}},
                "runtimeSpec": {"linux": {"resources": {"cpu": {"shares": 512}}}}}
    fake.script(POD_STATUS, response=v1.PodSandboxStatusResponse(info={"info": json.dumps(pod_info)}).SerializeToString())
    fake.script(CTR_STATUS, response=v1.ContainerStatusResponse(info={"info": json.dumps(ctr_info)}).SerializeToString())
    config = v1.PodSandboxConfig(metadata=v1.PodSandboxMetadata(name="web", uid="u-1", namespace="ns"))
    await client.unary_unary(RUN_POD)(v1.RunPodSandboxRequest(config=config).SerializeToString(), timeout=10)
    await client.unary_unary(CREATE)(v1.CreateContainerRequest(pod_sandbox_id="pod-1").SerializeToString(), timeout=10)
    async with hook_server(sock_dir, "start", {"PreStartContainer": {}}) as hook:
        hook.register(hook_dir, ["PreStartContainer"])
        await registered(running, 1)
        await client.unary_unary(START)(v1.StartContainerRequest(container_id="ctr-1").SerializeToString(), timeout=10)
    [seen] = hook.requests("PreStartContainer")
    assert seen["container_meta"] == {"name": "app", "attempt": 1, "id": "ctr-1"}
    assert (seen["pod_meta"]["uid"], seen["pod_labels"], seen["container_annotations"]) == ("u-1", {"app": "web"}, {"a": "1"})
    assert seen["container_resources"]["cpu_shares"] == "512"
