"""The order in which calls on one container or pod reach the runtime and
their hook events reach hook servers, and what does not wait for what."""

from __future__ import annotations

import asyncio

import grpc

from cri_api.v1 import api_pb2 as v1

from ...hookprocs import hook_server, registered
from .crirequests import CREATE, REMOVE, RUN_POD, START, STOP, STOP_POD, UPDATE, create_request, sandbox_config


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
            while running.hooks.locks.users("ctr-1") < 2:  # noqa: ASYNC110 - the lock table has no event (hot path); bounded
                await asyncio.sleep(0.01)
        assert fake.calls(UPDATE) == [] and [r["hook"] for r in hook.records()] == ["PreStartContainer"]
        fake.scripts[START].release.set()
        await asyncio.wait_for(asyncio.gather(start, updating), 10)
    assert [r.path for r in fake.received if r.path in (START, UPDATE)] == [START, UPDATE]
    assert [r["hook"] for r in hook.records()] == ["PreStartContainer", "PostStartContainer", "PreUpdateContainerResources"]


async def test_calls_on_one_container_keep_their_order(running, fake, client, sock_dir, hook_dir) -> None:
    """StartContainer then RemoveContainer for a container the proxy must first
    read back from the runtime: the runtime still sees them in that order."""
    status = "/runtime.v1.RuntimeService/ContainerStatus"
    fake.script(status, hang=True, code=grpc.StatusCode.NOT_FOUND)  # (a container the fake does not have)
    async with hook_server(sock_dir, "start", {"PreStartContainer": {}}) as hook:
        hook.register(hook_dir, ["PreStartContainer"])
        await registered(running, 1)
        start = asyncio.ensure_future(client.unary_unary(START)(v1.StartContainerRequest(container_id="old").SerializeToString(), timeout=10))
        await fake.wait_calls(status)
        remove = asyncio.ensure_future(client.unary_unary(REMOVE)(v1.RemoveContainerRequest(container_id="old").SerializeToString(), timeout=10))
        async with asyncio.timeout(5):
            while running.hooks.locks.users("old") < 2:  # noqa: ASYNC110 - the lock table has no event (hot path); bounded
                await asyncio.sleep(0.01)
        fake.scripts[status].release.set()
        await asyncio.wait_for(asyncio.gather(start, remove), 10)
    order = [r.path.rsplit("/", 1)[1] for r in fake.received if r.path in (START, REMOVE)]
    assert order == ["StartContainer", "RemoveContainer"]


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
