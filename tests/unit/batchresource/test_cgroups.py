from pathlib import Path, PurePosixPath

import pytest

from hooks.batchresource.cgroups import (
    CgroupDriver,
    CgroupFiles,
    Field,
    container_relative_path,
    detect_version,
    parent_relative_path,
    shares_to_weight,
    weight_to_shares,
)
from hooks.batchresource.resources import UNLIMITED, CgroupValues

from .fakecgroup import make_cgroup, read

UID = "0d4c8e4f_1a2b_4c3d_9e8f_001122334455"


@pytest.mark.parametrize(
    ("parent", "driver", "expected"),
    [
        (f"kubepods-besteffort-pod{UID}.slice", CgroupDriver.AUTO,
         f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID}.slice"),
        (f"kubepods-besteffort-pod{UID}.slice", CgroupDriver.SYSTEMD,
         f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID}.slice"),
        (f"kubepods-pod{UID}.slice", CgroupDriver.AUTO, f"kubepods.slice/kubepods-pod{UID}.slice"),
        ("kubepods.slice", CgroupDriver.AUTO, "kubepods.slice"),
        ("-.slice", CgroupDriver.SYSTEMD, "."),  # the root slice
        # A systemd parent already given as a path is kept.
        ("/kubepods.slice/kubepods-besteffort.slice/x.slice", CgroupDriver.AUTO, "kubepods.slice/kubepods-besteffort.slice/x.slice"),
        (f"/kubepods/besteffort/pod{UID}", CgroupDriver.AUTO, f"kubepods/besteffort/pod{UID}"),
        (f"/kubepods/besteffort/pod{UID}", CgroupDriver.CGROUPFS, f"kubepods/besteffort/pod{UID}"),
        ("/kubepods/pod1/", CgroupDriver.CGROUPFS, "kubepods/pod1"),
    ],
)
def test_parent_path(parent: str, driver: CgroupDriver, expected: str) -> None:
    assert parent_relative_path(parent, driver) == PurePosixPath(expected)


@pytest.mark.parametrize(("parent", "driver"), [("", CgroupDriver.AUTO), ("/kubepods/../etc", CgroupDriver.AUTO),
                                                 ("pod.scope", CgroupDriver.SYSTEMD), ("a--b.slice", CgroupDriver.SYSTEMD)])
def test_bad_parents(parent: str, driver: CgroupDriver) -> None:
    with pytest.raises(ValueError):
        parent_relative_path(parent, driver)


def test_container_paths() -> None:
    assert container_relative_path("/kubepods/besteffort/pod1", "abc", CgroupDriver.AUTO) == PurePosixPath("kubepods/besteffort/pod1/abc")
    assert container_relative_path("kubepods-besteffort-pod1.slice", "abc", CgroupDriver.AUTO) == PurePosixPath(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-abc.scope"
    )


@pytest.mark.parametrize(("shares", "weight"), [(0, 1), (2, 1), (3, 1), (512, 20), (1024, 39), (2048, 79), (262144, 10000), (10**9, 10000)])
def test_shares_to_weight(shares: int, weight: int) -> None:
    assert shares_to_weight(shares) == weight


@pytest.mark.parametrize("weight", [1, 2, 20, 39, 100, 5000, 9999, 10000])
def test_weight_to_shares_round_trips(weight: int) -> None:
    assert shares_to_weight(weight_to_shares(weight)) == weight


def test_detect_version(tmp_path: Path) -> None:
    assert detect_version(tmp_path) == 1
    (tmp_path / "cgroup.controllers").touch()
    assert detect_version(tmp_path) == 2


def test_file_names() -> None:
    v1 = CgroupFiles(Path("/sys/fs/cgroup"), 1, PurePosixPath("kubepods/pod1"))
    v2 = CgroupFiles(Path("/sys/fs/cgroup"), 2, PurePosixPath("kubepods/pod1"))
    assert v1.file_names() == {
        Field.CPU_SHARES: ("cpu.shares",),
        Field.CPU_QUOTA: ("cpu.cfs_period_us", "cpu.cfs_quota_us"),
        Field.MEMORY_LIMIT: ("memory.limit_in_bytes",),
        Field.MEMORY_SWAP: ("memory.memsw.limit_in_bytes",),  # (v1 with swap accounting)
    }
    assert v2.file_names() == {Field.CPU_SHARES: ("cpu.weight",), Field.CPU_QUOTA: ("cpu.max",), Field.MEMORY_LIMIT: ("memory.max",)}
    assert v1.file("cpu.shares") == Path("/sys/fs/cgroup/cpu/kubepods/pod1/cpu.shares")
    assert v1.file("memory.limit_in_bytes") == Path("/sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes")
    assert v2.file("cpu.weight") == Path("/sys/fs/cgroup/kubepods/pod1/cpu.weight")


WANTED = CgroupValues(cpu_shares=512, cpu_quota=50000, memory_limit=128 * 2**20)
UNBOUNDED = CgroupValues(cpu_shares=2, cpu_quota=UNLIMITED, memory_limit=UNLIMITED)


def write_all(files: CgroupFiles, values: CgroupValues) -> None:
    for field in Field:
        files.write(field, values)


def test_v1_write_and_read(tmp_path: Path) -> None:
    make_cgroup(tmp_path, 1, "kubepods/pod1")
    files = CgroupFiles(tmp_path, 1, PurePosixPath("kubepods/pod1"))
    assert files.read() == CgroupValues(cpu_shares=1024, cpu_quota=UNLIMITED, memory_limit=UNLIMITED)  # the kernel's "no limit"
    write_all(files, WANTED)
    assert read(tmp_path, 1, "kubepods/pod1", "cpu.shares") == "512"
    assert read(tmp_path, 1, "kubepods/pod1", "cpu.cfs_quota_us") == "50000"
    assert read(tmp_path, 1, "kubepods/pod1", "cpu.cfs_period_us") == "100000"
    assert read(tmp_path, 1, "kubepods/pod1", "memory.limit_in_bytes") == "134217728"
    assert files.read() == WANTED
    write_all(files, UNBOUNDED)
    assert read(tmp_path, 1, "kubepods/pod1", "cpu.cfs_quota_us") == "-1"
    assert read(tmp_path, 1, "kubepods/pod1", "memory.limit_in_bytes") == "-1"


def test_v2_write_and_read(tmp_path: Path) -> None:
    make_cgroup(tmp_path, 2, "kubepods/pod1")
    files = CgroupFiles(tmp_path, 2, PurePosixPath("kubepods/pod1"))
    write_all(files, WANTED)
    assert read(tmp_path, 2, "kubepods/pod1", "cpu.weight") == "20"
    assert read(tmp_path, 2, "kubepods/pod1", "cpu.max") == "50000 100000"
    assert read(tmp_path, 2, "kubepods/pod1", "memory.max") == "134217728"
    assert not files.differs(files.read(), WANTED, Field.CPU_SHARES)  # shares compared as weights
    write_all(files, UNBOUNDED)
    assert read(tmp_path, 2, "kubepods/pod1", "cpu.max") == "max 100000"
    assert read(tmp_path, 2, "kubepods/pod1", "memory.max") == "max"
    assert files.read() == CgroupValues(cpu_shares=2, cpu_quota=UNLIMITED, memory_limit=UNLIMITED)


def test_memory_compared_as_the_kernel_stores_it(tmp_path: Path) -> None:
    make_cgroup(tmp_path, 1, "p")
    files = CgroupFiles(tmp_path, 1, PurePosixPath("p"))
    (tmp_path / "memory/p/memory.limit_in_bytes").write_text("999997440")  # the kernel rounded 1e9 down to pages
    current = files.read()
    assert not files.differs(current, CgroupValues(2, UNLIMITED, 10**9), Field.MEMORY_LIMIT)
    assert files.differs(current, CgroupValues(2, UNLIMITED, 2 * 10**9), Field.MEMORY_LIMIT)


def test_exists_and_usage(tmp_path: Path) -> None:
    files = CgroupFiles(tmp_path, 1, PurePosixPath("p"))
    assert not files.exists()
    make_cgroup(tmp_path, 1, "p")
    assert files.exists()
    (tmp_path / "memory/p/memory.usage_in_bytes").write_text("4096\n")
    assert files.memory_usage() == 4096
