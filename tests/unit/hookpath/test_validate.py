"""validate.py: the resource values the kernel would refuse, named before runc meets them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cri_api.hookapi import api_pb2 as hookapi
from runtimeproxy.hookpath.validate import (
    NodeFacts,
    ParentCpuset,
    ParentSet,
    invalid_answer,
    invalid_resources,
    outside_parent,
    parse_id_list,
    read_node_facts,
)
from tests.fakesysfs import fake_root

GIB = 1 << 30
NODE = NodeFacts(online_cpus=frozenset({0, 1, 2, 3}), memory_nodes=frozenset({0}))


def reasons(**fields) -> list[str]:
    return invalid_resources(hookapi.LinuxContainerResources(**fields), NODE)


def test_what_kubelet_sends_is_valid() -> None:
    assert reasons() == []  # nothing set
    assert reasons(cpu_period=100_000, cpu_quota=50_000, cpu_shares=512, memory_limit_in_bytes=GIB,
                   oom_score_adj=-997, cpuset_cpus="0-1,3", cpuset_mems="0",
                   memory_swap_limit_in_bytes=2 * GIB, unified={"memory.high": "1G"},
                   hugepage_limits=[hookapi.HugepageLimit(page_size="2MB", limit=0)]) == []
    assert reasons(cpu_quota=-1, memory_limit_in_bytes=-1, memory_swap_limit_in_bytes=-1) == []  # unlimited
    assert reasons(memory_limit_in_bytes=8 * GIB, cpu_shares=2, cpu_period=1000, cpu_quota=1000) == []  # bounds
    # Limits overcommit: the kernel takes one far above any node's memory, and kubelet sends them.
    assert reasons(memory_limit_in_bytes=1 << 50, memory_swap_limit_in_bytes=1 << 51) == []
    # cgroup v2 files with capitals in their name.
    assert reasons(unified={"hugetlb.2MB.max": "0", "hugetlb.1GB.rsvd.max": "0", "cpu.weight.nice": "0"}) == []


@pytest.mark.parametrize(("fields", "expected"), [
    ({"cpu_quota": -5}, "cpu_quota -5 is negative and not -1"),
    ({"cpu_quota": 999}, "cpu_quota 999 is below the kernel's 1000"),
    ({"cpu_period": 999}, "cpu_period 999 is outside 1000..1000000"),
    ({"cpu_period": 1_000_001}, "cpu_period 1000001 is outside"),
    ({"cpu_period": -100_000}, "cpu_period -100000 is outside"),
    ({"cpu_shares": 1}, "cpu_shares 1 is outside 2..262144"),
    ({"cpu_shares": -2}, "cpu_shares -2 is outside"),
    ({"cpu_shares": 262_145}, "cpu_shares 262145 is outside"),
    ({"memory_limit_in_bytes": -2}, "memory_limit_in_bytes -2 is negative and not -1"),
    ({"memory_swap_limit_in_bytes": -7}, "memory_swap_limit_in_bytes -7 is negative"),
    ({"memory_limit_in_bytes": GIB, "memory_swap_limit_in_bytes": GIB - 1}, "below memory_limit_in_bytes"),
    ({"oom_score_adj": 1001}, "oom_score_adj 1001 is outside -1000..1000"),
    ({"oom_score_adj": -1001}, "oom_score_adj -1001 is outside"),
    ({"cpuset_cpus": "0-7"}, "names CPUs this node does not have online (4,5,6,7)"),
    ({"cpuset_cpus": "64"}, "(64)"),
    ({"cpuset_cpus": "1-0"}, "runs backwards"),
    ({"cpuset_cpus": "zero"}, "is not a list of ids"),
    ({"cpuset_cpus": "0-4294967295"}, "more than"),
    ({"cpuset_mems": "1"}, "cpuset_mems '1' names memory nodes without memory (1)"),
    ({"hugepage_limits": [hookapi.HugepageLimit(page_size="huge", limit=1)]}, "page_size 'huge'"),
    ({"unified": {"../../cpu.max": "1"}}, "unified key '../../cpu.max'"),
])
def test_values_the_kernel_refuses_are_named(fields, expected) -> None:
    found = reasons(**fields)
    assert len(found) == 1 and expected in found[0], found


def test_every_bad_value_is_reported_at_once_each_naming_its_field() -> None:
    found = reasons(cpu_quota=-3, cpuset_cpus="9", memory_limit_in_bytes=-5, unified={"x": "1"})
    assert [r.field for r in found] == ["cpu_quota", "memory_limit_in_bytes", "cpuset_cpus", "unified"]
    assert [r.split()[0] for r in found] == [r.field for r in found]


def test_many_missing_cpus_are_summarised() -> None:
    (reason,) = reasons(cpuset_cpus="0-1023")
    assert "(4,5,6,7,8,9,10,11,...)" in reason and len(reason) < 200


@pytest.mark.parametrize(("text", "ids"), [("0", {0}), ("0-3", {0, 1, 2, 3}), ("0-1,8,10-11\n", {0, 1, 8, 10, 11}),
                                           (" 2 , 4 ", {2, 4})])
def test_parse_id_list(text, ids) -> None:
    assert parse_id_list(text) == frozenset(ids)


@pytest.mark.parametrize("text", ["", "a", "1-", "-1", "1,,2", "3-1"])
def test_parse_id_list_refuses(text) -> None:
    with pytest.raises(ValueError):
        parse_id_list(text)


def memoryless_node_1(tmp_path: Path, *, cgroup_controllers: str | None, kernel: str = "6.8.0-45-generic\n") -> Path:
    """Nodes 0-1 online, node 1 with CPUs and no memory, nodes 0-3 possible (2-3 may be hot-added)."""
    root = fake_root(tmp_path, cpus="0-3\n", nodes="0-1\n")
    (root / "sys/devices/system/node/has_memory").write_text("0\n")
    (root / "sys/devices/system/node/possible").write_text("0-3\n")
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text(kernel)
    (root / "sys/fs/cgroup").mkdir(parents=True)
    if cgroup_controllers is not None:  # cgroup v2 mounted at /sys/fs/cgroup; v1 and hybrid: a tmpfs there
        (root / "sys/fs/cgroup/cgroup.controllers").write_text(cgroup_controllers)
    return root


def test_read_node_facts_from_sys_and_proc(tmp_path: Path) -> None:
    root = fake_root(tmp_path, cpus="0-5,7\n", nodes="0-1\n")
    assert read_node_facts(root) == NodeFacts(frozenset({0, 1, 2, 3, 4, 5, 7}), frozenset({0, 1}), "this node does not have online")


def test_on_cgroup_v1_memory_nodes_are_the_nodes_with_memory_not_every_online_one(tmp_path: Path) -> None:
    """Node 1 has CPUs and no memory: cgroup v1 refuses it in cpuset.mems (EINVAL)."""
    node = read_node_facts(memoryless_node_1(tmp_path, cgroup_controllers=None))
    assert node.memory_nodes == frozenset({0})
    (reason,) = invalid_resources(hookapi.LinuxContainerResources(cpuset_cpus="2", cpuset_mems="1"), node)
    assert reason == "cpuset_mems '1' names memory nodes without memory (1)"


def test_on_cgroup_v2_any_possible_node_is_taken(tmp_path: Path) -> None:
    """cgroup v2 takes any possible node in cpuset.mems (a memoryless one grants nothing: the
    effective set is what is left with memory, or the parent's), so the proxy refuses only the others."""
    node = read_node_facts(memoryless_node_1(tmp_path, cgroup_controllers="cpuset cpu io memory pids\n"))
    assert node.memory_nodes == frozenset({0, 1, 2, 3})
    assert invalid_resources(hookapi.LinuxContainerResources(cpuset_cpus="2", cpuset_mems="1"), node) == []
    assert invalid_resources(hookapi.LinuxContainerResources(cpuset_mems="0-3"), node) == []
    (reason,) = invalid_resources(hookapi.LinuxContainerResources(cpuset_mems="1,4-5"), node)
    assert reason == "cpuset_mems '1,4-5' names memory nodes this node cannot have (4,5)"


@pytest.mark.parametrize(("controllers", "kernel"), [
    ("cpu io memory pids\n", "6.8.0\n"),  # unified, but cpuset is on a v1 hierarchy (or not given to this cgroup)
    ("cpuset cpu io memory pids\n", "5.15.0-105-generic\n"),  # v2 on a kernel that may predate 2685027fca38
    ("cpuset cpu io memory pids\n", "not a release\n"),
    ("cpuset cpu io memory pids\n", "5.18.0-rc5\n"),  # the fix came after rc5
    ("cpuset cpu io memory pids\n", "5.9.0\n"),  # 9 < 18: compared as numbers, not strings
    ("cpuset cpu io memory pids\n", "4.19.0+\n"),
])
def test_cgroup_v2_without_its_rule_for_sure_keeps_the_nodes_with_memory(tmp_path: Path, controllers, kernel) -> None:
    node = read_node_facts(memoryless_node_1(tmp_path, cgroup_controllers=controllers, kernel=kernel))
    assert node.memory_nodes == frozenset({0})


@pytest.mark.parametrize("kernel", ["5.18.0\n", "5.18.0-rc6\n", "6.1.0-13-amd64\n", "10.0\n"])
def test_cgroup_v2_from_the_fix_on_takes_any_possible_node(tmp_path: Path, kernel: str) -> None:
    node = read_node_facts(memoryless_node_1(tmp_path, cgroup_controllers="cpuset cpu io memory pids\n", kernel=kernel))
    assert node.memory_nodes == frozenset({0, 1, 2, 3})


def test_without_numa_memory_node_0_is_the_only_one(tmp_path: Path) -> None:
    root = fake_root(tmp_path, cpus="0\n", nodes=None)
    assert read_node_facts(root).memory_nodes == frozenset({0})
    (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/cgroup.controllers").write_text("cpuset memory\n")
    assert read_node_facts(root).memory_nodes == frozenset({0})  # on cgroup v2 too


def test_this_node_reads() -> None:
    facts = read_node_facts()
    assert 0 in facts.online_cpus
    assert invalid_resources(hookapi.LinuxContainerResources(cpuset_cpus="0"), facts) == []


def resources(**fields) -> hookapi.LinuxContainerResources:
    return hookapi.LinuxContainerResources(**fields)


def test_an_answer_is_judged_merged_into_what_the_hook_was_shown() -> None:
    shown = resources(memory_limit_in_bytes=GIB, memory_swap_limit_in_bytes=GIB)  # kubelet's NoSwap
    (reason,) = invalid_answer(shown, resources(memory_limit_in_bytes=2 * GIB), NODE)
    assert reason == f"memory_swap_limit_in_bytes {GIB} is below memory_limit_in_bytes {2 * GIB}, once merged"
    assert reason.field == "memory_swap_limit_in_bytes"
    assert invalid_answer(shown, resources(memory_limit_in_bytes=2 * GIB, memory_swap_limit_in_bytes=2 * GIB), NODE) == []
    assert invalid_answer(shown, resources(memory_limit_in_bytes=GIB // 2), NODE) == []


def test_an_answer_alone_is_judged_first() -> None:
    assert invalid_answer(resources(), resources(cpu_quota=-5), NODE) == ["cpu_quota -5 is negative and not -1 (unlimited)"]


def test_what_the_hook_was_shown_is_not_the_answers_fault() -> None:
    shown = resources(memory_limit_in_bytes=GIB, memory_swap_limit_in_bytes=GIB // 2, cpuset_cpus="9")
    assert invalid_answer(shown, resources(cpu_quota=20_000), NODE) == []
    assert invalid_answer(shown, resources(), NODE) == []  # changes nothing


def test_a_value_the_hook_was_shown_is_not_its_fault_echoed_either() -> None:
    shown = resources(cpuset_cpus="0-5", memory_limit_in_bytes=GIB)  # CPUs 4 and 5 went offline since
    assert invalid_answer(shown, resources(cpuset_cpus="0-5", cpu_quota=20_000), NODE) == []
    (reason,) = invalid_answer(shown, resources(cpuset_cpus="0-6"), NODE)
    assert "(4,5,6)" in reason  # a cpuset of its own is the hook's


POD = "/kubepods/burstable/podx"
PARENT = ParentCpuset(POD, ParentSet(frozenset({0, 1}), POD), ParentSet(frozenset({0}), POD))


def test_a_cpuset_outside_the_parent_cgroups_is_named_with_the_parent() -> None:
    """cgroup v1: a cpuset must lie within its parent's (EACCES)."""
    (reason,) = outside_parent(resources(), resources(cpuset_cpus="0-3"), PARENT)
    assert reason == f"cpuset_cpus '0-3' names CPUs outside the parent cgroup {POD} (2,3; it has 0-1)"
    assert reason.field == "cpuset_cpus"
    (reason,) = outside_parent(resources(), resources(cpuset_cpus="1", cpuset_mems="0-1"), PARENT)
    assert reason == f"cpuset_mems '0-1' names memory nodes outside the parent cgroup {POD} (1; it has 0)"
    assert outside_parent(resources(), resources(cpuset_cpus="0-1", cpuset_mems="0"), PARENT) == []


def test_a_parent_not_made_yet_is_named_with_the_ancestor_it_will_copy() -> None:
    parent = ParentCpuset(POD, ParentSet(frozenset({0, 1}), "/kubepods/burstable"), None)
    (reason,) = outside_parent(resources(), resources(cpuset_cpus="2", cpuset_mems="5"), parent)
    assert reason == f"cpuset_cpus '2' names CPUs outside the parent cgroup {POD} (2; it will have 0-1, from /kubepods/burstable)"


def test_a_cpuset_the_hook_was_shown_is_never_its_own() -> None:
    """Left or echoed, under the parent it was shown or one it moved the
    container to (``parent`` is the one in effect after the answer)."""
    shown = resources(cpuset_cpus="3")  # kubelet's, say, from before the parent shrank
    assert outside_parent(shown, resources(cpu_quota=20_000), PARENT) == []
    assert outside_parent(shown, resources(cpuset_cpus="3"), PARENT) == []  # echoed
    (reason,) = outside_parent(shown, resources(cpuset_cpus="2-3"), PARENT)
    assert reason.startswith("cpuset_cpus '2-3' names CPUs outside")


def test_a_cpuset_that_is_no_list_is_left_to_invalid_resources() -> None:
    assert outside_parent(resources(), resources(cpuset_cpus="0-x"), PARENT) == []
