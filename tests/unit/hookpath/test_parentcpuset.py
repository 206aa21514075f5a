"""parentcpuset.py: where a pod cgroup parent lies in the cgroup v1 cpuset
hierarchy, and what its cpuset is (a fake tree stands for this node's)."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from runtimeproxy.hookpath.parentcpuset import ParentCpusets, cgroup_path, expand_slice
from runtimeproxy.hookpath.validate import ParentCpuset, ParentSet, parse_id_list
from tests.fakesysfs import CPUSET_MOUNT, cgroup_v1_cpuset
from tests.prerequisites import cgroup_v1_cpuset_mounted, fail_or_skip

POD = "/kubepods/burstable/poduid-1"
SLICE = "kubepods-burstable-poduid_1.slice"
SLICE_PATH = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poduid_1.slice"


@pytest.mark.parametrize(("name", "path"), [
    (SLICE, SLICE_PATH),
    ("kubepods.slice", "/kubepods.slice"),
    ("-.slice", "/"),
    ("a--b.slice", None),  # systemd (and runc) refuse empty components
    ("-a.slice", None),
    (".slice", None),
    ("kubepods", None),
    ("kubepods.slice/x.slice", None),
])
def test_a_slice_expands_as_runcs_systemd_driver_does(name: str, path: str | None) -> None:
    assert expand_slice(name) == path


@pytest.mark.parametrize(("parent", "path"), [
    (POD, POD),
    ("/kubepods/burstable/poduid-1/", POD),
    ("/kubepods/../../etc", "/etc"),  # never above the hierarchy's root
    ("//kubepods/burstable/poduid-1", POD),  # Linux takes "//" as "/" (normpath keeps it)
    ("///kubepods//burstable/poduid-1", POD),
    (SLICE, SLICE_PATH),
    (f"{SLICE}/", SLICE_PATH),
    # A path ending in a slice, as kubelet's systemd driver sends it: the same
    # cgroup under either driver (containerd keeps only the last slice under
    # systemd, and runc expands it alone).
    (SLICE_PATH, SLICE_PATH),
    (f"/{SLICE_PATH}/", SLICE_PATH),
    ("/rt.slice", "/rt.slice"),
    # Otherwise the cgroup depends on the driver: /rt.slice under systemd, this path under cgroupfs.
    ("/system.slice/rt.slice", None),
    ("/system.slice/rt.slice/", None),
    ("/a-b.slice", None),
    ("system.slice/rt.slice", None),
    ("/kubepods/a--b.slice", None),  # a slice runc refuses
    ("kubepods/burstable", None),  # relative: runc puts it under its own cgroup, not judged
])
def test_a_pod_cgroup_parent_is_a_cgroupfs_path_or_a_systemd_slice(parent: str, path: str | None) -> None:
    assert cgroup_path(parent) == path


def node(tmp_path: Path, **options: str) -> Path:
    """CPUs 0-3, nodes 0-1 at the root; burstable pods on 0-1, node 0."""
    cgroup_v1_cpuset(tmp_path, {"/": ("0-3", "0-1"), "/kubepods/burstable": ("0-1", "0")}, **options)
    return tmp_path


def test_a_cgroupfs_parent_is_read_where_it_is(tmp_path: Path) -> None:
    cgroup_v1_cpuset(node(tmp_path), {POD: ("1", "0")})
    assert ParentCpusets.of_host(tmp_path).read(POD) == ParentCpuset(
        POD, ParentSet(frozenset({1}), POD), ParentSet(frozenset({0}), POD)
    )


def test_a_systemd_parent_is_read_at_its_expanded_slice(tmp_path: Path) -> None:
    cgroup_v1_cpuset(node(tmp_path), {SLICE_PATH: ("2-3", "1")})
    parent = ParentCpusets.of_host(tmp_path).read(SLICE)
    assert parent is not None
    assert (parent.cgroup, parent.cpus, parent.mems) == (
        SLICE_PATH, ParentSet(frozenset({2, 3}), SLICE_PATH), ParentSet(frozenset({1}), SLICE_PATH)
    )


def test_a_path_ending_in_a_slice_that_depends_on_the_driver_is_not_judged(tmp_path: Path) -> None:
    """Under cgroupfs /system.slice/rt.slice is that cgroup, not /rt.slice,
    the one systemd's driver would make it under (with another cpuset)."""
    root = node(tmp_path)
    cgroup_v1_cpuset(root, {"/system.slice/rt.slice": ("0-3", "0"), "/rt.slice": ("0", "0")})
    assert ParentCpusets.of_host(root).read("/system.slice/rt.slice") is None


def test_a_parent_not_made_yet_has_its_nearest_ancestors_sets(tmp_path: Path) -> None:
    """runc makes it by copying its parent's sets."""
    parent = ParentCpusets.of_host(node(tmp_path)).read(POD)
    burstable = "/kubepods/burstable"
    assert parent == ParentCpuset(POD, ParentSet(frozenset({0, 1}), burstable), ParentSet(frozenset({0}), burstable))


def test_a_parent_with_an_empty_file_has_its_nearest_ancestors_set(tmp_path: Path) -> None:
    """Made but not set yet: runc copies the parent's into such a cgroup too, one file at a time."""
    root = node(tmp_path)
    cgroup_v1_cpuset(root, {POD: ("", "1")})
    parent = ParentCpusets.of_host(root).read(POD)
    assert parent is not None
    assert parent.cpus == ParentSet(frozenset({0, 1}), "/kubepods/burstable")
    assert parent.mems == ParentSet(frozenset({1}), POD)


def test_a_file_that_is_no_list_is_passed_over_for_the_ancestors(tmp_path: Path) -> None:
    root = node(tmp_path)
    cgroup_v1_cpuset(root, {POD: ("garbage", "0")})
    parent = ParentCpusets.of_host(root).read(POD)
    assert parent is not None and parent.cpus == ParentSet(frozenset({0, 1}), "/kubepods/burstable")


def test_nothing_readable_is_not_judged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cgroup_v1_cpuset(tmp_path, {})
    (tmp_path / CPUSET_MOUNT).mkdir(parents=True)  # mounted, but no cpuset file reads
    caplog.set_level(logging.DEBUG, logger="runtimeproxy.hookpath.parentcpuset")
    assert ParentCpusets.of_host(tmp_path).read(POD) is None
    (record,) = [r for r in caplog.records if r.getMessage() == "parent cgroup's cpuset not judged: unreadable"]
    assert (record.levelno, record.cgroup_parent) == (logging.DEBUG, POD)


def test_a_parent_with_a_nul_or_a_file_that_is_no_text_is_not_judged(tmp_path: Path) -> None:
    """os.open refuses a NUL (ValueError), as decode refuses bytes that are no
    UTF-8: neither is an error of the hook call, nor judged."""
    root = node(tmp_path)
    readers = ParentCpusets.of_host(root)
    assert readers.read("/kubepods/burstable/pod\0x") is None
    cgroup_v1_cpuset(root, {POD: ("0", "0")})
    (root / CPUSET_MOUNT / POD.lstrip("/") / "cpuset.cpus").write_bytes(b"\xff\n")
    assert readers.read(POD) is None


def test_a_parent_that_is_no_path_or_slice_is_not_judged(tmp_path: Path) -> None:
    readers = ParentCpusets.of_host(node(tmp_path))
    assert readers.judged
    assert readers.read("kubepods/burstable") is None
    assert readers.read("") is None


@pytest.mark.parametrize("mountinfo", [
    # cgroup v2 alone: a child's cpuset.cpus is not bounded by its parent's.
    "30 22 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
    # v1 in cpuset_v2_mode: the kernel skips the subset check (is_in_v2_mode).
    f"34 31 0:31 / /{CPUSET_MOUNT} rw - cgroup cgroup rw,cpuset,cpuset_v2_mode\n",
    # Only a part of the hierarchy mounted here: the pods' parents may lie outside it.
    f"34 31 0:31 /kubepods /{CPUSET_MOUNT} rw - cgroup cgroup rw,cpuset\n",
])
def test_without_the_legacy_rule_or_its_hierarchy_nothing_is_judged(tmp_path: Path, mountinfo: str) -> None:
    node(tmp_path)
    (tmp_path / "proc/self/mountinfo").write_text(mountinfo)
    readers = ParentCpusets.of_host(tmp_path)
    assert not readers.judged
    assert readers.read(POD) is None


def test_unreadable_mounts_judge_nothing(tmp_path: Path) -> None:
    assert not ParentCpusets.of_host(tmp_path).judged


def test_the_mount_found_is_logged_at_info(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Troubleshooting points at it: cpu and cpuset may be mounted together, elsewhere."""
    cgroup_v1_cpuset(tmp_path, {}, options="rw,cpu,cpuset")
    caplog.set_level(logging.INFO, logger="runtimeproxy.hookpath.parentcpuset")
    ParentCpusets.of_host(tmp_path)
    (record,) = [r for r in caplog.records if r.getMessage() == "parent cgroups' cpusets judged"]
    assert (record.levelno, record.cpuset_mount) == (logging.INFO, str(tmp_path / CPUSET_MOUNT))


def test_a_mount_point_with_a_space_is_found(tmp_path: Path) -> None:
    mount = tmp_path / "cg roups/cpuset"
    (mount / "kubepods").mkdir(parents=True)
    (mount / "kubepods/cpuset.cpus").write_text("3\n")
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/mountinfo").write_text("34 31 0:31 / /cg\\040roups/cpuset rw - cgroup cgroup rw,cpuset\n")
    parent = ParentCpusets.of_host(tmp_path).read("/kubepods")
    assert parent is not None and parent.cpus == ParentSet(frozenset({3}), "/kubepods")


def test_the_hierarchys_root_is_never_read(tmp_path: Path) -> None:
    """What is mounted there may be the proxy's own cgroup (a private cgroup
    namespace), pinned to fewer CPUs than the node's root has."""
    cgroup_v1_cpuset(tmp_path, {"/": ("0", "0"), "/kubepods": ("", "")})
    readers = ParentCpusets.of_host(tmp_path)
    assert readers.read(POD) is None
    assert readers.read("/") is None
    assert readers.read("-.slice") is None


class Bounded(ParentCpusets):
    """Counts the files it reads, and stops a walk that never ends."""

    def __init__(self, mount: Path) -> None:
        super().__init__(mount)
        self.files: list[str] = []

    def _read_text(self, path: str) -> str:
        self.files.append(path.removeprefix(str(self._mount)))
        assert len(self.files) < 50, "the walk up went on past the root"
        return super()._read_text(path)


def test_a_parent_spelt_with_a_leading_double_slash_never_reads_the_root(tmp_path: Path) -> None:
    """"//" is the root too: the walk up from "//kubepods/x" stops below it."""
    readers = Bounded(cgroup_v1_cpuset(tmp_path, {"/": ("0", "0")}))
    assert readers.read("//kubepods/x") is None
    assert readers.files == ["/kubepods/x/cpuset.cpus", "/kubepods/cpuset.cpus"]


def test_a_walk_up_ends_at_a_root_however_spelt(tmp_path: Path) -> None:
    """"//" is its own dirname: the walk stops there (it ran for ever on the
    event loop where the root's files were missing), never reading it."""
    readers = Bounded(cgroup_v1_cpuset(tmp_path, {}))
    (tmp_path / CPUSET_MOUNT).mkdir(parents=True)  # mounted, no file anywhere
    assert readers._nearest("//kubepods/x", ["cpuset.cpus", "cpuset.mems"]) == {}
    assert readers.files == ["//kubepods/x/cpuset.cpus", "//kubepods/cpuset.cpus"]


def test_this_node_reads() -> None:
    """This node: with a v1 cpuset hierarchy mounted, it is found (CI fails
    otherwise) and a cgroup in it is read where it is; without one nothing is judged."""
    readers = ParentCpusets.of_host()
    if readers.mount is None:
        if cgroup_v1_cpuset_mounted():
            fail_or_skip("a cgroup v1 cpuset hierarchy is mounted, yet the proxy judges nothing by it")
        assert readers.read("/kubepods") is None
        return
    assert readers.read(f"/rp-unit-{uuid.uuid4().hex[:8]}/pod") is None  # nothing made below the root
    # A cgroup of its own: a fresh machine (CI) may have none below the root yet.
    own = readers.mount / f"rp-unit-{uuid.uuid4().hex[:8]}"
    own.mkdir()
    try:
        # A v1 cpuset child starts empty: give it the root's, as runc gives a parent it makes.
        (own / "cpuset.cpus").write_text((readers.mount / "cpuset.cpus").read_text())
        parent = readers.read(f"/{own.name}/rp-unit-not-made")
        assert parent is not None and parent.cpus is not None
        assert parent.cpus == ParentSet(parse_id_list((own / "cpuset.cpus").read_text()), f"/{own.name}")
    finally:
        own.rmdir()
