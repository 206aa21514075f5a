"""The proxy judges hook answers by the node's facts as they are now: a CPU
brought online after it started may be handed out (a fake sysfs tree stands
for this node's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimeproxy.hookpath.validate import NodeFactsReader
from tests.fakesysfs import fake_root, parent_cpusets_of, set_online_cpus

from ...hookprocs import hook_server, registered
from .crirequests import CREATE, backend_request, create_request

PIN_TO_CPU_4 = {"PreCreateContainer": {"container_resources": {"cpuset_cpus": "4"}}}


@pytest.fixture(autouse=True)
def node_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Four CPUs online when the proxy starts (autouse: before ``running`` reads them)."""
    root = fake_root(tmp_path, cpus="0-3\n", nodes=None)
    monkeypatch.setattr("runtimeproxy.app.NodeFactsReader", lambda: NodeFactsReader(root))
    monkeypatch.setattr("runtimeproxy.app.ParentCpusets", parent_cpusets_of(root))  # no cpuset hierarchy: not judged
    return root


async def test_a_cpu_brought_online_after_start_may_be_handed_out(
    node_root: Path, running, fake, client, sock_dir: Path, hook_dir: Path
) -> None:
    set_online_cpus(node_root, "0-4\n")
    async with hook_server(sock_dir, "pin", PIN_TO_CPU_4) as hook:
        hook.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail")
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
    assert backend_request(fake).config.linux.resources.cpuset_cpus == "4"
