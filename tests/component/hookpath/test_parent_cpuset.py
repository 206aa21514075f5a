"""On cgroup v1 the proxy judges a hook's cpuset by the pod cgroup parent's:
one naming CPUs outside it is the hook's failure, by its failure policy,
not runc's EACCES at the container's start (a fake sysfs tree and cpuset
hierarchy stand for this node's)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc import aio

from runtimeproxy.hookpath.validate import NodeFactsReader
from tests.fakesysfs import cgroup_v1_cpuset, fake_root, parent_cpusets_of

from ...hookprocs import hook_server, registered
from .crirequests import CREATE, backend_request, create_request, sandbox_config

PIN_TO_CPU_2 = {"PreCreateContainer": {"container_resources": {"cpuset_cpus": "2"}}}
ISO = "/kubepods/isolated"  # CPUs 2-3
MOVE_TO_ISO = {"PreCreateContainer": {"pod_cgroup_parent": ISO}}


@pytest.fixture(autouse=True)
def node_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Four CPUs online; the pod's cgroup parent has CPUs 0-1 (autouse: before ``running`` starts)."""
    root = fake_root(tmp_path, cpus="0-3\n", nodes=None)
    parent = sandbox_config().linux.cgroup_parent
    cgroup_v1_cpuset(root, {"/": ("0-3", "0"), parent: ("0-1", "0"), ISO: ("2-3", "0")})
    monkeypatch.setattr("runtimeproxy.app.NodeFactsReader", lambda: NodeFactsReader(root))
    monkeypatch.setattr("runtimeproxy.app.ParentCpusets", parent_cpusets_of(root))
    return root


async def test_cpus_outside_the_parents_refuse_the_call_under_fail(running, fake, client, sock_dir: Path, hook_dir: Path) -> None:
    async with hook_server(sock_dir, "pin", PIN_TO_CPU_2) as hook:
        hook.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail")
        await registered(running, 1)
        with pytest.raises(aio.AioRpcError) as err:
            await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (
        "cpuset_cpus '2' names CPUs outside the parent cgroup /kubepods/burstable/poduid-1 (2; it has 0-1)"
        in err.value.details()
    )
    assert fake.calls(CREATE) == []
    labels = {"server": "pin.json", "hook": "PreCreateContainer", "outcome": "invalid_value"}
    assert running.metrics.registry.get_sample_value("runtime_proxy_hook_calls_total", labels) == 1


async def test_under_ignore_the_call_goes_on_without_the_answer(running, fake, client, sock_dir: Path, hook_dir: Path) -> None:
    async with hook_server(sock_dir, "pin", PIN_TO_CPU_2) as hook:
        hook.register(hook_dir, ["PreCreateContainer"], failure_policy="Ignore")
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
    assert backend_request(fake).config.linux.resources.cpuset_cpus == ""


async def test_a_cpuset_a_later_hooks_move_makes_fit_goes_on(running, fake, client, sock_dir: Path, hook_dir: Path) -> None:
    """pin's CPU 2 is outside the pod's parent, but iso then moves the container
    to a parent that has it: the chain's call is one the kernel takes."""
    async with hook_server(sock_dir, "pin", PIN_TO_CPU_2) as pin, hook_server(sock_dir, "iso", MOVE_TO_ISO) as iso:
        pin.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail", priority=1)
        iso.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail", priority=2)
        await registered(running, 2)
        await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
    sent = backend_request(fake)
    assert (sent.sandbox_config.linux.cgroup_parent, sent.config.linux.resources.cpuset_cpus) == (ISO, "2")


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_a_later_move_taking_a_cpuset_outside_its_parent_is_the_movers_failure(
    running, fake, client, sock_dir: Path, hook_dir: Path, policy: str,
) -> None:
    """pin's CPU 1 fits the pod's parent, not the one iso moves the container
    to: iso is refused by its policy, naming pin's cpuset (runc failed the
    container, EACCES, naming neither hook)."""
    pin_to_1 = {"PreCreateContainer": {"container_resources": {"cpuset_cpus": "1"}}}
    async with hook_server(sock_dir, "pin", pin_to_1) as pin, hook_server(sock_dir, "iso", MOVE_TO_ISO) as iso:
        pin.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail", priority=1)
        iso.register(hook_dir, ["PreCreateContainer"], failure_policy=policy, priority=2)
        await registered(running, 2)
        call = client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
        if policy == "Fail":
            with pytest.raises(aio.AioRpcError) as err:
                await call
        else:
            await call
    labels = {"server": "iso.json", "hook": "PreCreateContainer", "outcome": "invalid_value"}
    assert running.metrics.registry.get_sample_value("runtime_proxy_hook_calls_total", labels) == 1
    if policy == "Fail":
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.value.details().startswith("runtime-proxy: hook server iso.json")
        reason = f"cpuset_cpus '1' names CPUs outside the parent cgroup {ISO} (1; it has 2-3), set by pin.json"
        assert reason in err.value.details()
        assert fake.calls(CREATE) == []
    else:
        sent = backend_request(fake)
        assert (sent.sandbox_config.linux.cgroup_parent, sent.config.linux.resources.cpuset_cpus) == (
            sandbox_config().linux.cgroup_parent, "1"
        )


async def test_a_cpuset_a_later_whole_answer_clears_is_not_judged(
    running, fake, client, sock_dir: Path, hook_dir: Path,
) -> None:
    """pin's CPU 2 is outside the pod's parent; koordlet's whole answer then
    clears the cpuset: the container is made with none, not refused naming
    pin for a cpuset the runtime is never sent."""
    cleared = {"PreCreateContainer": {"container_resources": {"cpu_period": 100000}}}
    async with hook_server(sock_dir, "pin", PIN_TO_CPU_2) as pin, hook_server(sock_dir, "koordlet", cleared) as koordlet:
        pin.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail", priority=1)
        koordlet.register(hook_dir, ["PreCreateContainer"], failure_policy="Ignore", priority=2)
        await registered(running, 2)
        await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
    assert backend_request(fake).config.linux.resources.cpuset_cpus == ""


async def test_a_whole_answer_moving_without_resources_is_judged_for_the_cpusets_it_takes_along(
    running, fake, client, sock_dir: Path, hook_dir: Path,
) -> None:
    """pin's CPU 1 fits the pod's parent; koordlet's whole answer only moves
    the container to ISO (2-3), with no container_resources: it clears nothing,
    so pin's CPU 1 goes to ISO, and koordlet is refused naming it (the call
    left as (ISO, "1") and runc failed it, EACCES, naming neither hook)."""
    pin_to_1 = {"PreCreateContainer": {"container_resources": {"cpuset_cpus": "1"}}}
    async with hook_server(sock_dir, "pin", pin_to_1) as pin, hook_server(sock_dir, "koordlet", MOVE_TO_ISO) as koordlet:
        pin.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail", priority=1)
        koordlet.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail", priority=2)
        await registered(running, 2)
        with pytest.raises(aio.AioRpcError) as err:
            await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.details().startswith("runtime-proxy: hook server koordlet.json")
    assert f"outside the parent cgroup {ISO} (1; it has 2-3), set by pin.json" in err.value.details()
    assert fake.calls(CREATE) == []
