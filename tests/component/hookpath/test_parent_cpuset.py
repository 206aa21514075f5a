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


@pytest.fixture(autouse=True)
def node_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Four CPUs online; the pod's cgroup parent has CPUs 0-1 (autouse: before ``running`` starts)."""
    root = fake_root(tmp_path, cpus="0-3\n", nodes=None)
    parent = sandbox_config().linux.cgroup_parent
    cgroup_v1_cpuset(root, {"/": ("0-3", "0"), parent: ("0-1", "0")})
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
