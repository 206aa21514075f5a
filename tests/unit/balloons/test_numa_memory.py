"""cpuset.mems on machines whose NUMA nodes do not all have memory.

A node may have CPUs and no memory (its memory taken from the nearest node),
or memory and no CPUs. cgroup v1 refuses a cpuset.mems naming a node
without memory (EINVAL: not in the root cpuset's mems), so runc would fail
the container; cgroup v2 from kernel 5.18 takes it and grants no memory
from it. Machines are faked as sysfs trees, read as on a node.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hooks.balloons.config import parse_config
from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import Topology, write_synthetic_sysfs

from .test_server import FakeRuntime, request

# nodes 0: cpus 0-1, 1: cpus 2-3 (no memory), 2: cpus 4-5, 3: no CPUs (memory only)
DISTANCES = {
    0: {0: 10, 1: 20, 2: 30, 3: 40},
    1: {0: 20, 1: 10, 2: 30, 3: 40},
    2: {0: 30, 1: 30, 2: 10, 3: 40},
    3: {0: 40, 1: 40, 2: 40, 3: 10},
}


def machine(root: Path, memory_nodes: frozenset[int] | None = frozenset({0, 2, 3})) -> Topology:
    """Written as sysfs under ``root`` and read back from there."""
    shape = dataclasses.replace(Topology.synthetic(1, 3, 2, 1), memory_nodes=memory_nodes, distances=DISTANCES)
    write_synthetic_sysfs(root, shape)
    return Topology.from_sysfs(root)


def test_sysfs_says_which_nodes_have_memory(tmp_path) -> None:
    topo = machine(tmp_path)
    assert topo.memory_nodes == {0, 2, 3}
    assert topo.node_cpus == {0: {0, 1}, 1: {2, 3}, 2: {4, 5}}  # the memory-only node has no CPUs
    assert topo.distances[1] == DISTANCES[1]


def test_mems_name_only_nodes_with_memory(tmp_path) -> None:
    topo = machine(tmp_path)
    assert topo.mems_of({0, 1}) == {0}
    assert topo.mems_of({2, 3}) == {0}  # memory-less: the nearest node with memory
    assert topo.mems_of({3, 4}) == {2}  # a node of its own with memory is enough
    assert topo.mems_of({0, 2, 4}) == {0, 2}


def test_cpus_of_a_memory_less_node_without_distances_get_every_node_with_memory(tmp_path) -> None:
    topo = dataclasses.replace(machine(tmp_path), distances={})
    assert topo.mems_of({2}) == {0, 2, 3}


def test_without_memory_information_every_node_counts_as_having_memory(tmp_path) -> None:
    topo = machine(tmp_path)
    node = tmp_path / "devices" / "system" / "node"
    (node / "has_memory").unlink()
    assert Topology.from_sysfs(tmp_path).memory_nodes is None
    assert dataclasses.replace(topo, memory_nodes=None).mems_of({2, 3}) == {1}


async def test_a_container_on_a_memory_less_nodes_cpus_is_answered_mems_with_memory(tmp_path) -> None:
    machine(tmp_path / "sys")
    config = {"reservedResources": {"cpu": "cpuset:0-1"}, "balloonTypes": [{"name": "work", "namespaces": ["*"]}]}
    hook = BalloonsHook(str(tmp_path / "balloons.sock"), parse_config(config), sysfs_root=tmp_path / "sys",
                        runtime=FakeRuntime())
    await hook.rebuild()
    answer = await hook.pre_create_container(request("a", "app", shares=1024))
    resources = answer.container_resources
    assert (resources.cpuset_cpus, resources.cpuset_mems) == ("2", "0")  # node 1's CPU, node 0's memory
    system = await hook.pre_create_container(request("k", "dns", ns="kube-system"))
    assert system.container_resources.cpuset_mems == "0"
