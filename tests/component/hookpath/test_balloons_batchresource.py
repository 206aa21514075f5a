"""The balloons and batchresource hooks on one node, through the proxy, both
registered as ``hook run`` registers them (no --priority).

batchresource gives a BE pod's containers the cpu_shares of their batch-cpu
request (kubelet gave 2: no request); balloons sizes a container's balloon
from the cpu_shares it is shown. Whatever the files' names, balloons must
see the shares the runtime applies, at create as at every later update
(which shows the container's recorded shares): else a balloon sized at
create grows at the first update, or that update is refused.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cri_api.v1 import api_pb2 as v1
from hooks.balloons.config import parse_config
from hooks.balloons.runtime import Listing
from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import Topology
from hooks.batchresource.config import BatchResourceConfig
from hooks.batchresource.server import BatchResourceHook
from hooks.cli import Registration
from runtimeproxy.hookpath.validate import NodeFacts
from tests.fakesysfs import cgroup_v1_cpuset, parent_cpusets_of

from ...hookprocs import registered
from .crirequests import CREATE, UPDATE

BATCH_SPEC = {"containers": {"app": {"requests": {"kubernetes.io/batch-cpu": "3000"}, "limits": {"kubernetes.io/batch-cpu": "3000"}}}}


class NoContainers:
    """The balloons hook's runtime: nothing runs yet; moves are not followed here."""

    endpoint = "/none"
    closed = False

    async def list_containers(self) -> Listing:
        return Listing([], [])

    async def update_cpuset(self, container_id: str, cpus: str, mems: str) -> None:
        pass

    async def close(self) -> None:
        pass

    def reopen(self) -> None:  # (a start under the lock: RuntimeClient.reopen)
        pass


@pytest.fixture(autouse=True)
def eight_cpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The proxy checks answers against the node's online CPUs, and on cgroup v1
    the pod cgroup parent's: as many as the hook's machine (no pod cgroup made:
    the root's)."""
    monkeypatch.setattr("runtimeproxy.app.NodeFactsReader", lambda: lambda: NodeFacts(frozenset(range(8)), frozenset({0})))
    cgroup_v1_cpuset(tmp_path, {"/": ("0-7", "0")})
    monkeypatch.setattr("runtimeproxy.app.ParentCpusets", parent_cpusets_of(tmp_path))


@pytest.fixture
async def both_hooks(running, sock_dir: Path, hook_dir: Path) -> AsyncIterator[BalloonsHook]:
    config = parse_config({"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "work", "namespaces": ["*"]}]})
    balloons = BalloonsHook(str(sock_dir / "b.sock"), config, topology=Topology.synthetic(1, 1, 8, 1), runtime=NoContainers())
    cgroups = sock_dir / "cgroup"  # not the host's: the pod cgroup writes fail there and are only logged
    batch = BatchResourceHook(str(sock_dir / "r.sock"), BatchResourceConfig(cgroup_root=cgroups, cgroup_version=1, state_dir=sock_dir / "state"))
    await balloons.rebuild()
    async with balloons, batch:
        for server in (balloons, batch):
            Registration(hook_dir, server.NAME, "Fail", None, None).write(server)
        await registered(running, 2)
        yield balloons


def be_create() -> v1.CreateContainerRequest:
    sandbox = v1.PodSandboxConfig(
        metadata=v1.PodSandboxMetadata(name="be", uid="uid-be", namespace="batch"),
        labels={"koordinator.sh/qosClass": "BE"},
        annotations={"node.koordinator.sh/extended-resource-spec": json.dumps(BATCH_SPEC)},
        linux=v1.LinuxPodSandboxConfig(cgroup_parent="/kubepods/besteffort/poduid-be"),
    )
    resources = v1.LinuxContainerResources(cpu_shares=2)  # kubelet's for a pod without CPU requests
    config = v1.ContainerConfig(metadata=v1.ContainerMetadata(name="app"), linux=v1.LinuxContainerConfig(resources=resources))
    return v1.CreateContainerRequest(pod_sandbox_id="pod-1", config=config, sandbox_config=sandbox)


async def test_a_be_pods_balloon_is_sized_by_its_batch_request_at_create_and_after(both_hooks, fake, client) -> None:
    await client.unary_unary(CREATE)(be_create().SerializeToString())
    created = v1.CreateContainerRequest.FromString(fake.calls(CREATE)[0].requests[0]).config.linux.resources
    # Both answers hold: batchresource's shares and quota, balloons' cpuset for those 3 CPUs.
    assert (created.cpu_shares, created.cpu_quota) == (3072, 300000)
    assert (created.cpuset_cpus, created.cpuset_mems) == ("1-3", "0")
    # kubelet's CPU manager puts the container back on its shared pool: balloons holds it, unchanged.
    update = v1.UpdateContainerResourcesRequest(container_id="ctr-1", linux=v1.LinuxContainerResources(cpuset_cpus="0-7"))
    await client.unary_unary(UPDATE)(update.SerializeToString())
    updated = v1.UpdateContainerResourcesRequest.FromString(fake.calls(UPDATE)[0].requests[0]).linux
    assert updated.cpuset_cpus == "1-3"
    assert len(both_hooks.state.pool.balloon_of(("uid-be", "app")).cpus) == 3
