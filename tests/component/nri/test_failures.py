"""Hook servers that fail or hang, under each failure policy, within the
runtime's request timeout.

The fake runtime waits 2 s for each answer, as containerd does, on the same
event loop as the plugin: an answer later than that fails the call with a
TimeoutError (containerd would drop the plugin). Measuring on that clock,
rather than the wall clock, keeps the check fair on a loaded machine."""

from __future__ import annotations

import asyncio
import logging

import pytest

from cri_api.nri import api_pb2 as nri
from runtimeproxy.hookpath.points import HookType

from ...hookprocs import hook_server
from .conftest import container, pod
from .fakeruntime import Refused

FAILED_PRECONDITION = 9
QUOTA = {"container_resources": {"cpu_quota": 20000}}


async def create(link) -> nri.CreateContainerResponse:
    return await link.create_container(pod(), container())


@pytest.mark.parametrize("behaviour", ["error", "hang"])
async def test_fail_hook_refuses_the_container(connect, sock_dir, hook_dir, behaviour) -> None:
    async with hook_server(sock_dir, "strict", {"PreCreateContainer": behaviour}) as hook:
        hook.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail", timeout="10s")
        _, link = await connect([pod()])
        with pytest.raises(Refused) as refused:
            await create(link)  # the fake gives up after 2 s, as containerd does
    assert refused.value.code == FAILED_PRECONDITION
    assert "hook server strict" in refused.value.message and "failure-policy Fail" in refused.value.message
    assert not link.closed.is_set()  # a refused call, not a dropped plugin


async def test_ignore_hook_that_fails_is_passed_over(connect, sock_dir, hook_dir) -> None:
    async with (
        hook_server(sock_dir, "lax", {"PreCreateContainer": "error"}) as lax,
        hook_server(sock_dir, "quota", {"PreCreateContainer": QUOTA}) as quota,
    ):
        lax.register(hook_dir, ["PreCreateContainer"], failure_policy="Ignore", priority=1)
        quota.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail", priority=2)
        _, link = await connect([pod()])
        answer = await create(link)
    assert answer.adjust.linux.resources.cpu.quota.value == 20000  # the next server still ran


async def test_ignore_hook_that_hangs_is_given_up_in_time(connect, sock_dir, hook_dir) -> None:
    async with hook_server(sock_dir, "lax", {"PreCreateContainer": "hang"}) as lax:
        lax.register(hook_dir, ["PreCreateContainer"], failure_policy="Ignore", timeout="10s")
        _, link = await connect([pod()])
        answer = await create(link)  # the fake gives up after 2 s, as containerd does
    assert answer.adjust == nri.ContainerAdjustment()
    assert not link.closed.is_set()


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_a_runtime_waiting_less_than_the_flag_says_is_answered_in_its_time(
    connect, sock_dir, hook_dir, policy: str
) -> None:
    """containerd sets each request's timeout_nano from its own
    plugin_request_timeout: 1 s here, while --request-timeout says 2 s."""
    async with hook_server(sock_dir, "slow", {"PreCreateContainer": {**QUOTA, "delay": 1.2}}) as slow:
        slow.register(hook_dir, ["PreCreateContainer"], failure_policy=policy, timeout="10s")
        _, link = await connect([pod()])
        request = nri.CreateContainerRequest(pod=pod(), container=container())
        if policy == "Fail":
            with pytest.raises(Refused) as refused:
                await link.call("CreateContainer", request, nri.CreateContainerResponse, timeout=1.0)
            assert refused.value.code == FAILED_PRECONDITION
        else:
            answer = await link.call("CreateContainer", request, nri.CreateContainerResponse, timeout=1.0)
            assert answer.adjust == nri.ContainerAdjustment()  # in time, without the late hook's change
    assert not link.closed.is_set()


async def test_long_hook_timeouts_are_clamped_and_logged(start_plugin, sock_dir, hook_dir, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="runtimeproxy.nri")
    async with hook_server(sock_dir, "slow", {}) as hook:
        hook.register(hook_dir, ["PreCreateContainer"], timeout="30s")
        plugin = await start_plugin(request_timeout=1.5)
    [server] = plugin.dispatcher.servers(HookType.PRE_CREATE_CONTAINER)
    assert server.timeout == pytest.approx(1.0)
    [clamped] = [r for r in caplog.records if r.getMessage() == "hook timeout longer than NRI allows, clamped"]
    assert clamped.hook_timeout == 30.0 and clamped.clamped_timeout == pytest.approx(1.0)


async def test_a_chain_longer_than_the_runtime_waits(connect, sock_dir, hook_dir) -> None:
    """Each hook within its own timeout, together over the runtime's: the
    last one gets what is left, and, a Fail hook, refuses the call in time
    (rather than the runtime dropping the plugin)."""
    slow = {"PreCreateContainer": {**QUOTA, "delay": 1.0}}
    async with hook_server(sock_dir, "a", slow) as a, hook_server(sock_dir, "b", slow) as b:
        a.register(hook_dir, ["PreCreateContainer"], failure_policy="Ignore", priority=1)
        b.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail", priority=2)
        _, link = await connect([pod()])
        with pytest.raises(Refused) as refused:
            await create(link)
    assert refused.value.code == FAILED_PRECONDITION
    assert "hook server b" in refused.value.message and "answer within" in refused.value.message
    assert len(a.requests()) == len(b.requests()) == 1


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_a_post_hook_still_running_costs_the_next_pre_hook_none_of_its_time(
    connect, sock_dir, hook_dir, policy: str
) -> None:
    """The pod's first container's PostStartContainer hangs; the next
    container's PreCreateContainer, which orders after it (same pod), goes
    rather than wait out the runtime's time and lose its answer."""
    quota = {"PreCreateContainer": {**QUOTA, "delay": 0.2}}
    async with (hook_server(sock_dir, "watch", {"PostStartContainer": "hang"}) as watch,
                hook_server(sock_dir, "quota", quota) as limiter):
        watch.register(hook_dir, ["PostStartContainer"], failure_policy="Ignore", timeout="10s")
        limiter.register(hook_dir, ["PreCreateContainer"], failure_policy=policy)
        first = container("ctr-1")
        _, link = await connect([pod()], [first])
        await link.state_change(nri.Event.START_CONTAINER, pod(), first)
        await link.state_change(nri.Event.POST_START_CONTAINER, pod(), first)
        answer = await link.create_container(pod(), container("ctr-2"))
    assert answer.adjust.linux.resources.cpu.quota.value == 20000


def stall_after_pre_hooks(plugin, monkeypatch) -> asyncio.Event:  # type: ignore[no-untyped-def]
    """The stage is held, once its pre hooks answered, until the event is set
    (a stalled node): NRI's time runs out with the hooks' change made."""
    run_pre, release = plugin.dispatcher.run_pre, asyncio.Event()

    async def stalled(*args, **kwargs):  # type: ignore[no-untyped-def]
        changed = await run_pre(*args, **kwargs)
        await release.wait()
        return changed

    monkeypatch.setattr(plugin.dispatcher, "run_pre", stalled)
    return release


async def test_a_pod_hook_answered_after_nri_went_on_is_not_recorded(connect, sock_dir, hook_dir, monkeypatch) -> None:
    """RunPodSandbox: the pod runs as the runtime made it; a PreRunPodSandbox
    answer the stage gets after the event's time must not reach its record."""
    async with hook_server(sock_dir, "labels", {"PreRunPodSandbox": {"labels": {"late": "yes"}}}) as labeller:
        labeller.register(hook_dir, ["PreRunPodSandbox"], failure_policy="Ignore")
        plugin, link = await connect([])
        release = stall_after_pre_hooks(plugin, monkeypatch)
        event = nri.StateChangeEvent(event=nri.Event.RUN_POD_SANDBOX, pod=pod())
        await link.call("StateChange", event, nri.Empty, timeout=1.0)
        assert len(labeller.requests("PreRunPodSandbox")) == 1
        release.set()
        await plugin.adapter.idle()
    assert "late" not in plugin.store.pods["pod-1"].labels


@pytest.mark.parametrize("event", ["create", "update"])
async def test_a_change_made_after_nri_went_on_is_not_recorded_as_applied(
    connect, sock_dir, hook_dir, monkeypatch, event: str
) -> None:
    """The hook answered in time, but the stage was held past the runtime's
    time after it (a stalled node): NRI went on without the change, so the
    store must not record a quota the container never got."""
    hook = {"create": "PreCreateContainer", "update": "PreUpdateContainerResources"}[event]
    async with hook_server(sock_dir, "quota", {hook: QUOTA}) as limiter:
        limiter.register(hook_dir, [hook], failure_policy="Ignore")
        plugin, link = await connect([pod()], [container()] if event == "update" else [])
        release = stall_after_pre_hooks(plugin, monkeypatch)
        if event == "create":
            request = nri.CreateContainerRequest(pod=pod(), container=container())
            answer = await link.call("CreateContainer", request, nri.CreateContainerResponse, timeout=1.0)
            assert answer.adjust == nri.ContainerAdjustment()
        else:
            wanted = nri.LinuxResources(cpu=nri.LinuxCPU(quota=nri.OptionalInt64(value=50000)))
            request = nri.UpdateContainerRequest(pod=pod(), container=container(), linux_resources=wanted)
            answer = await link.call("UpdateContainer", request, nri.UpdateContainerResponse, timeout=1.0)
            assert not any(u.linux.resources.cpu.quota.value == 20000 for u in answer.update)
        assert len(limiter.requests(hook)) == 1  # it answered: the change was made
        release.set()
        await plugin.adapter.idle()
    record = plugin.store.containers.get("ctr-1")
    if event == "create":
        assert record is None  # recorded at its next event, from the runtime's data
    else:  # kubelet's update, as NRI applied it, without the hook's change
        assert record is not None and record.container_resources.cpu_quota == 50000
    # The container's next event records it from the runtime's data.
    await link.state_change(nri.Event.START_CONTAINER, pod(), container())
    assert "ctr-1" in plugin.store.containers
