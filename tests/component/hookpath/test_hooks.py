"""Issue 4 against a fake backend that shows exactly what reached it, with
real hook-server processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import grpc
import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1alpha2 import api_pb2 as v1alpha2
from runtimeproxy.app import build_proxy
from runtimeproxy.config import ProxyConfig
from runtimeproxy.hookpath.points import HookType

from ...hookprocs import hook_server, registered
from ..fakes import FakeBackend

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
START = "/runtime.v1.RuntimeService/StartContainer"
RUN_POD = "/runtime.v1.RuntimeService/RunPodSandbox"
UPDATE = "/runtime.v1.RuntimeService/UpdateContainerResources"
REMOVE = "/runtime.v1.RuntimeService/RemoveContainer"
STOP = "/runtime.v1.RuntimeService/StopContainer"
STOP_POD = "/runtime.v1.RuntimeService/StopPodSandbox"
POD_STATUS = "/runtime.v1.RuntimeService/PodSandboxStatus"

QUOTA_HOOK = {
    "PreCreateContainer": {
        "container_resources": {"cpu_period": 100000, "cpu_quota": 20000, "memory_limit_in_bytes": 67108864},
        "container_annotations": {"hooked-by": "quota"},
        "container_envs": {"HOOKED": "1", "KEEP": "overridden"},
    }
}


def sandbox_config(**labels: str) -> v1.PodSandboxConfig:
    return v1.PodSandboxConfig(
        metadata=v1.PodSandboxMetadata(name="web", uid="uid-1", namespace="default", attempt=0),
        labels={"app": "web", **labels},
        annotations={"pod-note": "x"},
        linux=v1.LinuxPodSandboxConfig(cgroup_parent="/kubepods/burstable/poduid-1"),
    )


def create_request(**labels: str) -> v1.CreateContainerRequest:
    return v1.CreateContainerRequest(
        pod_sandbox_id="pod-1",
        config=v1.ContainerConfig(
            metadata=v1.ContainerMetadata(name="app", attempt=1),
            image=v1.ImageSpec(image="busybox"),
            command=["sleep", "1"],
            envs=[v1.KeyValue(key="KEEP", value=b"original"), v1.KeyValue(key="RAW", value=b"\xff\xfe")],
            annotations={"c-note": "y"},
            linux=v1.LinuxContainerConfig(
                resources=v1.LinuxContainerResources(cpu_shares=256, memory_limit_in_bytes=1 << 30),
                security_context=v1.LinuxContainerSecurityContext(privileged=False, readonly_rootfs=True),
            ),
            mounts=[v1.Mount(container_path="/data", host_path="/srv/data", readonly=True)],
        ),
        sandbox_config=sandbox_config(**labels),
    )




def backend_request(fake: FakeBackend, path: str = CREATE, index: int = -1) -> v1.CreateContainerRequest:
    return v1.CreateContainerRequest.FromString(fake.calls(path)[index].requests[0])


async def test_without_hooks_the_original_bytes_go_through(running, fake, client) -> None:
    raw = create_request().SerializeToString() + b"\xba\x3e\x01z"  # plus an unknown field
    await client.unary_unary(CREATE)(raw)
    assert fake.calls(CREATE)[0].requests == [raw]


async def test_pre_create_hook_changes_only_what_hooks_may(running, fake, client, sock_dir, hook_dir) -> None:
    async with hook_server(sock_dir, "quota", QUOTA_HOOK) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        original = create_request()
        reply = await client.unary_unary(CREATE)(original.SerializeToString())
        assert v1.CreateContainerResponse.FromString(reply).container_id == "ctr-1"

    sent = backend_request(fake)
    res = sent.config.linux.resources
    assert (res.cpu_period, res.cpu_quota, res.memory_limit_in_bytes) == (100000, 20000, 64 << 20)
    assert res.cpu_shares == 256  # left unset by the hook: original kept
    assert sent.config.annotations == {"c-note": "y", "hooked-by": "quota"}
    assert [(e.key, e.value) for e in sent.config.envs] == [
        ("KEEP", b"overridden"), ("RAW", b"\xff\xfe"), ("HOOKED", b"1")
    ]
    # Everything else is untouched.
    expected = create_request()
    for msg in (sent, expected):
        msg.config.linux.resources.Clear()
        msg.config.annotations.clear()
        del msg.config.envs[:]
    assert sent == expected
    # The hook saw the request as kubelet sent it (non-UTF-8 env left out).
    seen = hook.requests("PreCreateContainer")[0]
    assert seen["container_envs"] == {"KEEP": "original"}
    assert seen["pod_meta"]["uid"] == "uid-1"
    assert seen["pod_cgroup_parent"] == "/kubepods/burstable/poduid-1"
    assert seen["container_resources"]["cpu_shares"] == "256"


async def test_v1alpha2_client_is_hooked_too(running, fake, client, sock_dir, hook_dir) -> None:
    path = "/runtime.v1alpha2.RuntimeService/CreateContainer"
    fake.script(path, response=v1alpha2.CreateContainerResponse(container_id="ctr-2").SerializeToString())
    request = v1alpha2.CreateContainerRequest(
        pod_sandbox_id="pod-1",
        config=v1alpha2.ContainerConfig(metadata=v1alpha2.ContainerMetadata(name="old")),
        sandbox_config=v1alpha2.PodSandboxConfig(metadata=v1alpha2.PodSandboxMetadata(name="p", uid="u")),
    )
    async with hook_server(sock_dir, "quota", QUOTA_HOOK) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        await client.unary_unary(path)(request.SerializeToString())
    sent = v1alpha2.CreateContainerRequest.FromString(fake.calls(path)[0].requests[0])
    assert sent.config.linux.resources.cpu_quota == 20000
    assert {e.key: e.value for e in sent.config.envs} == {"HOOKED": "1", "KEEP": "overridden"}


async def test_chaining_in_priority_then_name_order(running, fake, client, sock_dir, hook_dir) -> None:
    first = {"PreCreateContainer": {"container_resources": {"cpu_quota": 10000}, "container_annotations": {"order": "first"}}}
    second = {"PreCreateContainer": {"container_resources": {"cpu_quota": 30000}, "container_annotations": {"second": "yes"}}}
    async with hook_server(sock_dir, "b-first", first) as a, hook_server(sock_dir, "a-second", second) as b:
        a.register(hook_dir, ["PreCreateContainer"], priority=-5)
        b.register(hook_dir, ["PreCreateContainer"], priority=10)
        await registered(running, 2)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        # The second saw the first's changes.
        seen = b.requests("PreCreateContainer")[0]
        assert seen["container_resources"]["cpu_quota"] == "10000"
        assert seen["container_annotations"]["order"] == "first"
        assert a.requests("PreCreateContainer")[0]["container_annotations"] == {"c-note": "y"}
    sent = backend_request(fake)
    assert sent.config.linux.resources.cpu_quota == 30000
    assert sent.config.annotations["order"] == "first" and sent.config.annotations["second"] == "yes"


FAULTS = {
    "error": {"PreCreateContainer": {"behaviour": "error", "message": "policy engine says no"}},
    "hang": {"PreCreateContainer": "hang"},
    "crash": {"PreCreateContainer": {"behaviour": "crash"}},
}


@pytest.mark.parametrize("fault", ["absent", "error", "hang", "crash"])
@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_failure_policies(running, fake, client, sock_dir, hook_dir, fault, policy) -> None:
    timeout = 0.5
    async with contextlib.AsyncExitStack() as stack:
        if fault == "absent":
            from hooks.sdk import write_hook_config

            write_hook_config(hook_dir, "gone", sock_dir / "nobody-listens.sock", ["PreCreateContainer"], policy, f"{int(timeout * 1000)}ms")
        else:
            hook = await stack.enter_async_context(hook_server(sock_dir, "faulty", FAULTS[fault]))
            hook.register(hook_dir, ["PreCreateContainer"], policy, timeout=f"{int(timeout * 1000)}ms")
        await registered(running, 1)
        started = time.monotonic()
        call = client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
        if policy == "Fail":
            with pytest.raises(aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "faulty" in err.value.details() or "gone" in err.value.details()
            assert fake.calls(CREATE) == []  # the backend was never asked
        else:
            await call
            assert backend_request(fake) == create_request()  # unmodified
        elapsed = time.monotonic() - started
        assert elapsed < timeout + 1.0, f"{fault}/{policy} took {elapsed:.2f}s"


@pytest.mark.parametrize("behaviour", ["error", "hang"])
async def test_post_hook_failure_never_fails_or_delays_the_call(running, fake, client, sock_dir, hook_dir, behaviour) -> None:
    async with hook_server(sock_dir, "post", {"PostStopContainer": {"behaviour": behaviour}}) as hook:
        hook.register(hook_dir, ["PostStopContainer"], "Fail", timeout="2s")
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        started = time.monotonic()
        await client.unary_unary(STOP)(v1.StopContainerRequest(container_id="ctr-1").SerializeToString(), timeout=1.5)
        assert time.monotonic() - started < 1.0  # the answer does not wait for post hooks
        # Nor does the next call on the same container, which has no hook to order.
        await client.unary_unary(REMOVE)(v1.RemoveContainerRequest(container_id="ctr-1").SerializeToString(), timeout=1.0)
        await running.hooks.drain()
        assert len(hook.requests("PostStopContainer")) == 1
        assert hook.requests("PostStopContainer")[0]["container_meta"]["id"] == "ctr-1"


async def test_hook_events_of_one_container_reach_hook_servers_in_order(running, fake, client, sock_dir, hook_dir) -> None:
    """A slow post hook delays the next pre hook on the same container, not the runtime calls
    in between, nor the hooks of other containers."""
    delay = 1.0  # long enough that the calls with a deadline of delay / 2 prove they did not wait for it
    script = {"PostStartContainer": {"delay": delay}, "PreUpdateContainerResources": {}, "PreStartContainer": {}}
    async with hook_server(sock_dir, "events", script) as hook:
        hook.register(hook_dir, list(script), timeout="5s")
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        fake.script(CREATE, response=v1.CreateContainerResponse(container_id="other").SerializeToString())
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        await client.unary_unary(START)(v1.StartContainerRequest(container_id="ctr-1").SerializeToString())
        update = v1.UpdateContainerResourcesRequest(container_id="ctr-1", linux=v1.LinuxContainerResources(cpu_shares=512))
        # Stop has no hook here: it reaches the runtime while PostStartContainer is still being answered.
        await client.unary_unary(STOP)(v1.StopContainerRequest(container_id="ctr-1").SerializeToString(), timeout=delay / 2)
        # Another container's pre hook is not held up either.
        await client.unary_unary(START)(v1.StartContainerRequest(container_id="other").SerializeToString(), timeout=delay / 2)
        await client.unary_unary(UPDATE)(update.SerializeToString(), timeout=5)
        await running.hooks.drain()
        events = [(r["hook"], r["request"]["container_meta"]["id"]) for r in hook.records()]
        ours = [e for e in events if e[1] == "ctr-1"]
        assert ours == [("PreStartContainer", "ctr-1"), ("PostStartContainer", "ctr-1"), ("PreUpdateContainerResources", "ctr-1")]
        # The other container's PreStart came while ctr-1's PostStart was still being answered.
        assert events.index(("PreStartContainer", "other")) < events.index(("PreUpdateContainerResources", "ctr-1"))
        (post_start,) = [r for r in hook.records("PostStartContainer") if r["request"]["container_meta"]["id"] == "ctr-1"]
        (pre_update,) = hook.records("PreUpdateContainerResources")
        # The post hook's answer took `delay`; the next pre hook on ctr-1 was sent after that answer.
        assert pre_update["time"] >= post_start["time"] + delay


async def test_update_is_not_held_up_behind_a_long_stop(running, fake, client, sock_dir, hook_dir) -> None:
    """A stop waiting out its grace period does not block kubelet's resource updates of that
    container (the CPU manager's reconcile loop sends them at any time)."""
    async with hook_server(sock_dir, "update", {"PreUpdateContainerResources": {"container_resources": {"cpu_quota": 5000}}}) as hook:
        hook.register(hook_dir, ["PreUpdateContainerResources"])
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        fake.script(STOP, hang=True)
        stop = asyncio.ensure_future(client.unary_unary(STOP)(v1.StopContainerRequest(container_id="ctr-1", timeout=600).SerializeToString(), timeout=10))
        await fake.wait_calls(STOP)
        update = v1.UpdateContainerResourcesRequest(container_id="ctr-1", linux=v1.LinuxContainerResources(cpu_period=100000, cpu_quota=90000))
        await client.unary_unary(UPDATE)(update.SerializeToString(), timeout=5)
        assert not stop.done()  # the update went through while the stop is still under way
        sent = v1.UpdateContainerResourcesRequest.FromString(fake.calls(UPDATE)[0].requests[0])
        assert sent.linux.cpu_quota == 5000
        fake.scripts[STOP].release.set()
        await asyncio.wait_for(stop, 10)
    assert running.store.containers["ctr-1"].container_resources.cpu_quota == 5000
    assert len(running.hooks.locks) == 0


async def test_a_call_arriving_during_another_on_the_same_container_waits_for_it(
    running, fake, client, sock_dir, hook_dir
) -> None:
    """Start is still at the runtime when an update comes: the update reaches the runtime after
    Start returned, and hook servers see PreStart, PostStart, PreUpdate in that order."""
    script = {"PreStartContainer": {}, "PostStartContainer": {}, "PreUpdateContainerResources": {}}
    async with hook_server(sock_dir, "events", script) as hook:
        hook.register(hook_dir, list(script))
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        fake.script(START, hang=True)
        start = asyncio.ensure_future(client.unary_unary(START)(v1.StartContainerRequest(container_id="ctr-1").SerializeToString(), timeout=10))
        await fake.wait_calls(START)
        update = v1.UpdateContainerResourcesRequest(container_id="ctr-1", linux=v1.LinuxContainerResources(cpu_shares=512))
        updating = asyncio.ensure_future(client.unary_unary(UPDATE)(update.SerializeToString(), timeout=10))
        async with asyncio.timeout(5):
            while running.hooks.locks.users("ctr-1") < 2:  # the update waits behind Start
                await asyncio.sleep(0.01)
        assert fake.calls(UPDATE) == [] and [r["hook"] for r in hook.records()] == ["PreStartContainer"]
        fake.scripts[START].release.set()
        await asyncio.wait_for(asyncio.gather(start, updating), 10)
    assert [r.path for r in fake.received if r.path in (START, UPDATE)] == [START, UPDATE]
    assert [r["hook"] for r in hook.records()] == ["PreStartContainer", "PostStartContainer", "PreUpdateContainerResources"]


@pytest.mark.parametrize("path", [CREATE, STOP], ids=["serialised", "ordered-until-issued"])
async def test_runtime_errors_on_hooked_calls_reach_the_client_unchanged(running, fake, client, sock_dir, hook_dir, path) -> None:
    trailing = (("x-runtime-detail", "gone"),)
    fake.script(path, code=grpc.StatusCode.NOT_FOUND, details="container not found", trailing=trailing)
    async with hook_server(sock_dir, "any", {}) as hook:
        hook.register(hook_dir, ["PreCreateContainer", "PostStopContainer"])
        await registered(running, 1)
        request = create_request() if path == CREATE else v1.StopContainerRequest(container_id="ctr-1")
        with pytest.raises(aio.AioRpcError) as err:
            await client.unary_unary(path)(request.SerializeToString(), timeout=5)
        await running.hooks.drain()
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.NOT_FOUND, "container not found")
        assert ("x-runtime-detail", "gone") in tuple(err.value.trailing_metadata() or ())
        assert "PostStopContainer" not in [r["hook"] for r in hook.records()]  # post hooks follow success only
    assert len(running.hooks.locks) == 0


@pytest.mark.parametrize("path", [START, STOP], ids=["serialised", "ordered-until-issued"])
async def test_client_cancel_of_a_hooked_call_reaches_the_runtime(running, fake, client, path) -> None:
    await client.unary_unary(CREATE)(create_request().SerializeToString())
    fake.script(path, hang=True)
    request = (v1.StartContainerRequest if path == START else v1.StopContainerRequest)(container_id="ctr-1")
    call = client.unary_unary(path)(request.SerializeToString(), timeout=10)
    await fake.wait_calls(path)
    call.cancel()
    await asyncio.wait_for(fake.cancel_seen.wait(), 5)
    assert fake.cancelled == [path]
    async with asyncio.timeout(5):
        while len(running.hooks.locks):  # the handler unwinds after the cancel reached it
            await asyncio.sleep(0.01)



@contextlib.asynccontextmanager
async def records_kept(running, sock_dir: Path, hook_dir: Path):  # type: ignore[no-untyped-def]
    """A hook server on a point these calls never reach: the proxy records
    calls only while some hook server is registered (with none, the frames
    path relays them unrecorded)."""
    async with hook_server(sock_dir, "elsewhere", {"PreUpdateContainerResources": {}}) as hook:
        hook.register(hook_dir, ["PreUpdateContainerResources"])
        await registered(running, 1)
        yield

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


async def test_recreated_sandbox_is_announced_after_the_old_one_stopped(running, fake, client, sock_dir, hook_dir) -> None:
    """Stop a sandbox and run its replacement (same pod uid) at once: hook servers still see
    PostStopPodSandbox of the old one before PreRunPodSandbox of the new one."""
    delay = 1.0  # long enough that the calls with a deadline of delay / 2 prove they did not wait for it
    script = {"PostStopPodSandbox": {"delay": delay}, "PreRunPodSandbox": {}}
    run_pod = v1.RunPodSandboxRequest(config=sandbox_config()).SerializeToString()
    async with hook_server(sock_dir, "pods", script) as hook:
        hook.register(hook_dir, list(script), timeout="5s")
        await registered(running, 1)
        await client.unary_unary(RUN_POD)(run_pod)
        await client.unary_unary(STOP_POD)(v1.StopPodSandboxRequest(pod_sandbox_id="pod-1").SerializeToString(), timeout=delay / 2)
        fake.script(RUN_POD, response=v1.RunPodSandboxResponse(pod_sandbox_id="pod-2").SerializeToString())
        await client.unary_unary(RUN_POD)(run_pod, timeout=5)
        await running.hooks.drain()
    assert [r["hook"] for r in hook.records()] == ["PreRunPodSandbox", "PostStopPodSandbox", "PreRunPodSandbox"]
    post_stop, rerun = hook.records()[1:]
    assert rerun["time"] >= post_stop["time"] + delay
    assert post_stop["request"]["pod_meta"]["uid"] == rerun["request"]["pod_meta"]["uid"] == "uid-1"


async def test_a_restarted_container_is_announced_after_the_old_one_stopped(running, fake, client, sock_dir, hook_dir) -> None:
    """kubelet restarts a container: the new attempt's PreCreateContainer (ordered by its pod) reaches
    hook servers after the old attempt's PostStopContainer."""
    delay = 1.0  # long enough that the stop's deadline of delay / 2 proves it did not wait for it
    script = {"PostStopContainer": {"delay": delay}, "PreCreateContainer": {}}
    async with hook_server(sock_dir, "restarts", script) as hook:
        hook.register(hook_dir, list(script), timeout="5s")
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        await client.unary_unary(STOP)(v1.StopContainerRequest(container_id="ctr-1").SerializeToString(), timeout=delay / 2)
        fake.script(CREATE, response=v1.CreateContainerResponse(container_id="ctr-2").SerializeToString())
        await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=5)
        await running.hooks.drain()
    assert [r["hook"] for r in hook.records()] == ["PreCreateContainer", "PostStopContainer", "PreCreateContainer"]
    post_stop, recreate = hook.records()[1:]
    assert recreate["time"] >= post_stop["time"] + delay


async def test_skip_label_bypasses_hooks(running, fake, client, sock_dir, hook_dir) -> None:
    async with hook_server(sock_dir, "quota", QUOTA_HOOK) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        raw = create_request(**{"runtimeproxy.koordinator.sh/skip-hookserver": "true"}).SerializeToString()
        await client.unary_unary(CREATE)(raw)
        assert fake.calls(CREATE)[0].requests == [raw]
        assert hook.requests() == []


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


async def test_live_add_change_delete(running, fake, client, sock_dir, hook_dir) -> None:
    async with hook_server(sock_dir, "quota", QUOTA_HOOK) as hook:
        path = hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        assert backend_request(fake).config.linux.resources.cpu_quota == 20000
        # Change: it no longer registers for PreCreateContainer.
        hook.register(hook_dir, ["PreStartContainer"])
        async with asyncio.timeout(5):
            while running.registry.servers_for(HookType.PRE_CREATE_CONTAINER):
                await asyncio.sleep(0.05)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        assert backend_request(fake).config.linux.resources.cpu_quota == 0
        path.unlink()
        await registered(running, 0)


async def test_removing_a_hook_mid_call_does_not_hang_the_call(running, fake, client, sock_dir, hook_dir) -> None:
    slow = {"PreCreateContainer": {"container_resources": {"cpu_quota": 7000}, "delay": 0.5}}
    async with hook_server(sock_dir, "slow", slow) as hook:
        path = hook.register(hook_dir, ["PreCreateContainer"], "Ignore", timeout="2s")
        await registered(running, 1)
        call = asyncio.ensure_future(client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10))
        async with asyncio.timeout(5):
            while not hook.requests("PreCreateContainer"):
                await asyncio.sleep(0.02)  # the record file has no change event to await
        path.unlink()
        await registered(running, 0)
        started = time.monotonic()
        await asyncio.wait_for(call, 3)
        assert time.monotonic() - started < 2.0
    assert backend_request(fake).config.linux.resources.cpu_quota == 7000  # the call under way finished


class GarbageHookServer:
    """Answers every hook with bytes that are no hook response."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.server = aio.server()

        class Handler(grpc.GenericRpcHandler):
            def service(self, details):  # type: ignore[no-untyped-def]
                async def answer(request: bytes, context: aio.ServicerContext) -> bytes:
                    return b"\xff\xff\xff"

                return grpc.unary_unary_rpc_method_handler(answer)

        self.server.add_generic_rpc_handlers((Handler(),))
        self.server.add_insecure_port(f"unix://{socket}")


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_undecodable_hook_answer_follows_the_policy(running, fake, client, sock_dir, hook_dir, policy) -> None:
    from hooks.sdk import write_hook_config

    garbage = GarbageHookServer(sock_dir / "garbage.sock")
    await garbage.server.start()
    try:
        write_hook_config(hook_dir, "garbage", garbage.socket, ["PreCreateContainer"], policy, "1s")
        await registered(running, 1)
        call = client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=5)
        if policy == "Fail":
            with pytest.raises(aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "garbage" in err.value.details() and "not a valid" in err.value.details()
            assert fake.calls(CREATE) == []
        else:
            await call
            assert backend_request(fake) == create_request()
    finally:
        await garbage.server.stop(0)


async def test_calls_on_one_container_keep_their_order(running, fake, client, sock_dir, hook_dir) -> None:
    """StartContainer then RemoveContainer for a container the proxy must first
    read back from the runtime: the runtime still sees them in that order."""
    status = "/runtime.v1.RuntimeService/ContainerStatus"
    fake.script(status, hang=True)
    async with hook_server(sock_dir, "start", {"PreStartContainer": {}}) as hook:
        hook.register(hook_dir, ["PreStartContainer"])
        await registered(running, 1)
        start = asyncio.ensure_future(client.unary_unary(START)(v1.StartContainerRequest(container_id="old").SerializeToString(), timeout=10))
        await fake.wait_calls(status)
        remove = asyncio.ensure_future(client.unary_unary(REMOVE)(v1.RemoveContainerRequest(container_id="old").SerializeToString(), timeout=10))
        async with asyncio.timeout(5):
            while running.hooks.locks.users("old") < 2:  # Remove waits behind Start
                await asyncio.sleep(0.01)
        fake.scripts[status].release.set()
        await asyncio.wait_for(asyncio.gather(start, remove), 10)
    order = [r.path.rsplit("/", 1)[1] for r in fake.received if r.path in (START, REMOVE)]
    assert order == ["StartContainer", "RemoveContainer"]


async def test_chain_sees_pod_cgroup_parent_set_by_earlier_hook(running, fake, client, sock_dir, hook_dir) -> None:
    mover = {"PreCreateContainer": {"pod_cgroup_parent": "/kubepods/besteffort/moved"}}
    async with hook_server(sock_dir, "a", mover) as a, hook_server(sock_dir, "b", {"PreCreateContainer": {}}) as b:
        a.register(hook_dir, ["PreCreateContainer"], priority=1)
        b.register(hook_dir, ["PreCreateContainer"], priority=2)
        await registered(running, 2)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        assert b.requests("PreCreateContainer")[0]["pod_cgroup_parent"] == "/kubepods/besteffort/moved"
    assert backend_request(fake).sandbox_config.linux.cgroup_parent == "/kubepods/besteffort/moved"
    assert running.store.containers["ctr-1"].pod_cgroup_parent == "/kubepods/besteffort/moved"


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


async def test_metrics_endpoint(fake, sock_dir, hook_dir) -> None:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, hook_dir=hook_dir, metrics_listen=f"127.0.0.1:{port}")
    fake.script(CREATE, response=v1.CreateContainerResponse(container_id="ctr-9").SerializeToString())
    async with contextlib.AsyncExitStack() as stack, hook_server(sock_dir, "quota", QUOTA_HOOK) as hook:
        running = await build_proxy(config, stack)
        await running.proxy.wait_ready(10)
        hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as channel:
            await channel.unary_unary(CREATE)(create_request().SerializeToString())
        def scrape() -> str:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()

        text = await asyncio.to_thread(scrape)
        # The runtime goes away: readiness drops until it is back and probed again.
        lost, back = asyncio.Event(), asyncio.Event()
        running.proxy.backend.on_lost(lost.set)
        running.proxy.backend.on_change(lambda info: back.set())
        await fake.stop()
        await asyncio.wait_for(lost.wait(), 15)
        assert "runtime_proxy_backend_ready 0.0" in await asyncio.to_thread(scrape)
        await fake.start()
        await asyncio.wait_for(back.wait(), 15)
        assert "runtime_proxy_backend_ready 1.0" in await asyncio.to_thread(scrape)
    assert "runtime_proxy_backend_ready 1.0" in text
    assert "runtime_proxy_hook_servers 1.0" in text
    assert 'runtime_proxy_hook_calls_total{hook="PreCreateContainer",outcome="ok",server="quota.json"} 1.0' in text
    assert 'runtime_proxy_hooked_calls_total{method="CreateContainer",outcome="ok"} 1.0' in text


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
            while not running.hooks._rechecks:  # noqa: SLF001 - the handler notices the client left
                await asyncio.sleep(0.01)
            await running.hooks.rechecked()
        assert "pod-1" not in running.hooks.store.pods
        fake.scripts[remove_pod].release.set()
