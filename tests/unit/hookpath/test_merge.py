"""merge.py: how a hook's answer is merged into a CRI request."""

from __future__ import annotations

import pytest

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from cri_api.v1alpha2 import api_pb2 as v1alpha2
from runtimeproxy.hookpath.merge import (
    emptied_cpusets,
    env_map,
    hook_resources,
    merge_cgroup_parent,
    merge_env,
    merge_map,
    merge_resources,
)

NUMBERS = (
    "cpu_period",
    "cpu_quota",
    "cpu_shares",
    "memory_limit_in_bytes",
    "oom_score_adj",
    "memory_swap_limit_in_bytes",
)


def original_resources() -> v1.LinuxContainerResources:
    return v1.LinuxContainerResources(
        cpu_period=100000,
        cpu_quota=50000,
        cpu_shares=512,
        memory_limit_in_bytes=1 << 30,
        oom_score_adj=-500,
        memory_swap_limit_in_bytes=2 << 30,
        cpuset_cpus="0-3",
        cpuset_mems="0",
        hugepage_limits=[v1.HugepageLimit(page_size="2MB", limit=1 << 21)],
        unified={"memory.high": "900M", "pids.max": "100"},
    )


# --------------------------------------------------------------------------- resources


def test_hook_resources_copies_every_field() -> None:
    out = hook_resources(original_resources())
    assert isinstance(out, hookapi.LinuxContainerResources)
    # The same field numbers and values: the hook sees exactly the original.
    assert v1.LinuxContainerResources.FromString(out.SerializeToString()) == original_resources()
    assert out.unified == {"memory.high": "900M", "pids.max": "100"}
    assert [(h.page_size, h.limit) for h in out.hugepage_limits] == [("2MB", 1 << 21)]


def test_empty_update_keeps_everything_and_reports_no_change() -> None:
    target = original_resources()
    assert merge_resources(target, hookapi.LinuxContainerResources()) is False
    assert target == original_resources()


def test_update_equal_to_original_reports_no_change() -> None:
    target = original_resources()
    assert merge_resources(target, hook_resources(original_resources())) is False
    assert target == original_resources()


@pytest.mark.parametrize("name", NUMBERS)
def test_a_set_number_overrides_and_the_rest_is_kept(name: str) -> None:
    target = original_resources()
    value = -999 if name == "oom_score_adj" else 12345
    update = hookapi.LinuxContainerResources(**{name: value})
    assert merge_resources(target, update) is True
    assert getattr(target, name) == value
    expected = original_resources()
    setattr(expected, name, value)
    assert target == expected


@pytest.mark.parametrize("name", ["cpuset_cpus", "cpuset_mems"])
def test_a_set_string_overrides(name: str) -> None:
    target = original_resources()
    assert merge_resources(target, hookapi.LinuxContainerResources(**{name: "7"})) is True
    expected = original_resources()
    setattr(expected, name, "7")
    assert target == expected


def test_unset_values_in_update_keep_original_while_others_override() -> None:
    target = original_resources()
    update = hookapi.LinuxContainerResources(cpu_quota=20000, memory_limit_in_bytes=64 << 20)
    assert merge_resources(target, update) is True
    assert (target.cpu_period, target.cpu_quota, target.cpu_shares) == (100000, 20000, 512)
    assert target.memory_limit_in_bytes == 64 << 20
    assert target.cpuset_cpus == "0-3"
    assert target.unified == {"memory.high": "900M", "pids.max": "100"}


def test_hugepages_merge_by_page_size() -> None:
    target = original_resources()  # 2MB: 1 << 21
    update = hookapi.LinuxContainerResources(
        hugepage_limits=[hookapi.HugepageLimit(page_size="1GB", limit=1 << 30)]
    )
    assert merge_resources(target, update) is True
    # A size the hook does not name keeps kubelet's limit; a new one is appended.
    assert [(h.page_size, h.limit) for h in target.hugepage_limits] == [("2MB", 1 << 21), ("1GB", 1 << 30)]
    assert merge_resources(target, update) is False
    lowered = hookapi.LinuxContainerResources(hugepage_limits=[hookapi.HugepageLimit(page_size="2MB", limit=1 << 20)])
    assert merge_resources(target, lowered) is True
    assert [(h.page_size, h.limit) for h in target.hugepage_limits] == [("2MB", 1 << 20), ("1GB", 1 << 30)]


def test_hugepages_a_size_listed_twice_gets_the_limit_in_every_entry() -> None:
    # containerd appends an update's limits to the spec's: a list echoed from
    # it may name a size twice, and runc writes them in turn (the last wins).
    target = v1.LinuxContainerResources(
        hugepage_limits=[v1.HugepageLimit(page_size="2MB", limit=0), v1.HugepageLimit(page_size="2MB", limit=2)]
    )
    update = hookapi.LinuxContainerResources(hugepage_limits=[hookapi.HugepageLimit(page_size="2MB", limit=8)])
    assert merge_resources(target, update) is True
    assert [(h.page_size, h.limit) for h in target.hugepage_limits] == [("2MB", 8), ("2MB", 8)]


def test_hugepages_order_is_no_change_and_empty_keeps() -> None:
    target = v1.LinuxContainerResources(
        hugepage_limits=[v1.HugepageLimit(page_size="2MB", limit=1), v1.HugepageLimit(page_size="1GB", limit=2)]
    )
    assert merge_resources(target, hookapi.LinuxContainerResources()) is False
    assert len(target.hugepage_limits) == 2
    reordered = hookapi.LinuxContainerResources(
        hugepage_limits=[hookapi.HugepageLimit(page_size="1GB", limit=2), hookapi.HugepageLimit(page_size="2MB", limit=1)]
    )
    assert merge_resources(target, reordered) is False
    assert [h.page_size for h in target.hugepage_limits] == ["2MB", "1GB"]


def test_unified_merges_by_key() -> None:
    target = original_resources()
    update = hookapi.LinuxContainerResources(unified={"memory.high": "500M", "cpu.weight": "50"})
    assert merge_resources(target, update) is True
    assert dict(target.unified) == {"memory.high": "500M", "pids.max": "100", "cpu.weight": "50"}
    # Keys already equal: no change.
    assert merge_resources(target, hookapi.LinuxContainerResources(unified={"pids.max": "100"})) is False


def test_merge_into_hook_resources_and_v1alpha2_work_alike() -> None:
    update = hookapi.LinuxContainerResources(cpu_shares=2, unified={"a": "b"})
    for target in (hookapi.LinuxContainerResources(cpu_shares=1), v1alpha2.LinuxContainerResources(cpu_shares=1)):
        assert merge_resources(target, update) is True
        assert target.cpu_shares == 2
        assert dict(target.unified) == {"a": "b"}


# --------------------------------------------------------------------------- maps


def test_emptied_cpusets_are_those_set_that_the_answer_leaves_empty() -> None:
    shown = hook_resources(original_resources())
    assert shown.cpuset_cpus and shown.cpuset_mems
    assert emptied_cpusets(shown, hookapi.LinuxContainerResources()) == ("cpuset_cpus", "cpuset_mems")
    assert emptied_cpusets(shown, hookapi.LinuxContainerResources(cpuset_mems="0")) == ("cpuset_cpus",)
    # Whatever else the answer holds (kubelet's own values echoed or not): no guessing.
    echo = hookapi.LinuxContainerResources(cpu_period=shown.cpu_period, oom_score_adj=shown.oom_score_adj)
    assert emptied_cpusets(shown, echo) == ("cpuset_cpus", "cpuset_mems")
    # Nothing set, nothing to clear.
    assert emptied_cpusets(hookapi.LinuxContainerResources(cpu_period=100000), hookapi.LinuxContainerResources()) == ()


def test_merge_map_adds_and_overrides_and_keeps() -> None:
    target = {"a": "1", "b": "2"}
    assert merge_map(target, {"b": "20", "c": "3"}) is True
    assert target == {"a": "1", "b": "20", "c": "3"}
    assert merge_map(target, {"a": "1"}) is False
    assert merge_map(target, {}) is False
    assert target == {"a": "1", "b": "20", "c": "3"}


def test_merge_map_on_proto_map() -> None:
    config = v1.ContainerConfig(annotations={"x": "1"})
    assert merge_map(config.annotations, {"y": "2"}) is True
    assert dict(config.annotations) == {"x": "1", "y": "2"}
    assert merge_map(config.annotations, {"x": "1", "y": "2"}) is False


def test_merge_map_can_set_an_empty_value() -> None:
    target = {"a": "1"}
    assert merge_map(target, {"a": ""}) is True
    assert target == {"a": ""}


# --------------------------------------------------------------------------- env


def envs(*pairs: tuple[str, bytes]) -> v1.ContainerConfig:
    return v1.ContainerConfig(envs=[v1.KeyValue(key=k, value=v) for k, v in pairs])


def pairs(config: v1.ContainerConfig) -> list[tuple[str, bytes]]:
    return [(e.key, e.value) for e in config.envs]


def test_env_map_leaves_out_non_utf8_values() -> None:
    config = envs(("A", b"1"), ("RAW", b"\xff\xfe"), ("U", "é".encode()), ("EMPTY", b""))
    assert env_map(config.envs) == {"A": "1", "U": "é", "EMPTY": ""}


def test_env_map_reads_v1alpha2_string_values() -> None:
    config = v1alpha2.ContainerConfig(envs=[v1alpha2.KeyValue(key="A", value="x")])
    assert env_map(config.envs) == {"A": "x"}


def test_env_map_last_duplicate_wins() -> None:
    assert env_map(envs(("A", b"1"), ("A", b"2")).envs) == {"A": "2"}


def test_merge_env_overrides_in_place_and_appends_in_name_order() -> None:
    config = envs(("PATH", b"/bin"), ("KEEP", b"k"), ("HOME", b"/root"))
    assert merge_env(config.envs, {"ZED": "z", "HOME": "/home/app", "ALPHA": "a", "MID": "m"}) is True
    assert pairs(config) == [
        ("PATH", b"/bin"),
        ("KEEP", b"k"),
        ("HOME", b"/home/app"),
        ("ALPHA", b"a"),
        ("MID", b"m"),
        ("ZED", b"z"),
    ]


def test_merge_env_no_change() -> None:
    config = envs(("A", b"1"))
    assert merge_env(config.envs, {"A": "1"}) is False
    assert merge_env(config.envs, {}) is False
    assert pairs(config) == [("A", b"1")]


def test_merge_env_encodes_utf8() -> None:
    config = envs()
    assert merge_env(config.envs, {"U": "ünï"}) is True
    assert pairs(config) == [("U", "ünï".encode())]


def test_merge_env_overrides_every_duplicate() -> None:
    config = envs(("A", b"1"), ("B", b"b"), ("A", b"2"))
    assert merge_env(config.envs, {"A": "3"}) is True
    assert pairs(config) == [("A", b"3"), ("B", b"b"), ("A", b"3")]


def test_merge_env_never_loses_an_unnamed_non_utf8_original() -> None:
    raw = b"\xff\xfe\x00binary"
    config = envs(("RAW", raw), ("A", b"1"))
    # What a hook sees, and echoes back with a change: RAW is not in it.
    seen = env_map(config.envs)
    assert "RAW" not in seen
    answer = {**seen, "A": "2", "NEW": "n"}
    assert merge_env(config.envs, answer) is True
    assert pairs(config) == [("RAW", raw), ("A", b"2"), ("NEW", b"n")]
    # And it survives the wire byte-identically.
    assert pairs(v1.ContainerConfig.FromString(config.SerializeToString())) == pairs(config)


def test_merge_env_replaces_a_non_utf8_original_the_hook_named() -> None:
    config = envs(("RAW", b"\xff"))
    assert merge_env(config.envs, {"RAW": "clean"}) is True
    assert pairs(config) == [("RAW", b"clean")]


def test_merge_cgroup_parent_takes_a_new_parent_and_keeps_the_original_for_an_empty_one() -> None:
    """Guards existing behaviour (RunPodSandbox's and CreateContainer's apply, now through one helper)."""
    linux = v1.LinuxPodSandboxConfig(cgroup_parent="/kubepods/pod1")
    assert merge_cgroup_parent(linux, "") is False
    assert merge_cgroup_parent(linux, "/kubepods/pod1") is False
    assert linux.cgroup_parent == "/kubepods/pod1"
    assert merge_cgroup_parent(linux, "/moved/pod1") is True
    assert linux.cgroup_parent == "/moved/pod1"
