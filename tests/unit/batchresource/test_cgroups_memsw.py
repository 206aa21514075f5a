"""cgroup v1's memory+swap limit: the kernel refuses (EINVAL) a memory limit
above memory.memsw.limit_in_bytes, and containerd makes a container with both
equal; a limit is written in runc's order. The fake refuses as the kernel does."""

from __future__ import annotations

import errno
from pathlib import Path, PurePosixPath

import pytest

from hooks.batchresource.cgroups import CgroupFiles, Field
from hooks.batchresource.resources import UNLIMITED, CgroupValues

from .fakecgroup import make_cgroup, read, write

MIB = 2**20
MEMSW = "memory.memsw.limit_in_bytes"
MEMSW_USAGE = "memory.memsw.usage_in_bytes"
NO_LIMIT = "9223372036854771712"


def kernel_like(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """CgroupFiles._write refusing a memory limit above memsw, and memsw below
    the memory limit; the writes made, in order."""
    writes: list[tuple[str, str]] = []
    real = CgroupFiles._write  # noqa: SLF001

    def limit(files: CgroupFiles, name: str) -> int:
        value = int(files.file(name).read_text())
        return 2**63 if value in (-1, int(NO_LIMIT)) else value

    def checked(files: CgroupFiles, name: str, value: str) -> None:
        new = 2**63 if value == "-1" else int(value)
        if (name == "memory.limit_in_bytes" and files.file(MEMSW).is_file() and new > limit(files, MEMSW)) or (
                name == MEMSW and new < limit(files, "memory.limit_in_bytes")):
            raise OSError(errno.EINVAL, "Invalid argument")
        writes.append((name, value))
        real(files, name, value)

    monkeypatch.setattr(CgroupFiles, "_write", checked)
    return writes


def container(tmp_path: Path, memory: int, memsw: int | None) -> CgroupFiles:
    make_cgroup(tmp_path, 1, "pod/c")
    write(tmp_path, 1, "pod/c", "memory.limit_in_bytes", str(memory))
    if memsw is not None:
        write(tmp_path, 1, "pod/c", MEMSW, str(memsw))
        write(tmp_path, 1, "pod/c", MEMSW_USAGE, "0")
    return CgroupFiles(tmp_path, 1, PurePosixPath("pod/c"))


def limit(memory: int) -> CgroupValues:
    return CgroupValues(cpu_shares=2, cpu_quota=UNLIMITED, memory_limit=memory)


def test_raising_above_memsw_raises_memsw_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a ``crictl update`` to 96Mi leaves (both 96Mi), put back to 128Mi
    (before: memory.limit_in_bytes alone, refused EINVAL every pass)."""
    files = container(tmp_path, 96 * MIB, 96 * MIB)
    writes = kernel_like(monkeypatch)
    files.write(Field.MEMORY_LIMIT, limit(128 * MIB))
    assert writes == [(MEMSW, str(128 * MIB)), ("memory.limit_in_bytes", str(128 * MIB))]
    assert read(tmp_path, 1, "pod/c", MEMSW) == str(128 * MIB)


def test_lowering_a_tied_memsw_lowers_it_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = container(tmp_path, 256 * MIB, 256 * MIB)
    writes = kernel_like(monkeypatch)
    files.write(Field.MEMORY_LIMIT, limit(128 * MIB))
    assert writes == [("memory.limit_in_bytes", str(128 * MIB)), (MEMSW, str(128 * MIB))]


def test_unlimited_raises_memsw_to_unlimited_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = container(tmp_path, 96 * MIB, 96 * MIB)
    writes = kernel_like(monkeypatch)
    files.write(Field.MEMORY_LIMIT, limit(UNLIMITED))
    assert writes == [(MEMSW, "-1"), ("memory.limit_in_bytes", "-1")]


@pytest.mark.parametrize("memory", [64 * MIB, 256 * MIB])
def test_a_memsw_above_the_limit_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory: int) -> None:
    """A pod cgroup's memsw (kubelet sets none: unlimited), or a container given swap."""
    files = container(tmp_path, 128 * MIB, None)
    write(tmp_path, 1, "pod/c", MEMSW, NO_LIMIT)
    writes = kernel_like(monkeypatch)
    files.write(Field.MEMORY_LIMIT, limit(memory))
    assert writes == [("memory.limit_in_bytes", str(memory))]


def test_no_swap_accounting_writes_the_memory_limit_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards existing behaviour: no memsw file (swapaccount=0)."""
    files = container(tmp_path, 96 * MIB, None)
    writes = kernel_like(monkeypatch)
    files.write(Field.MEMORY_LIMIT, limit(128 * MIB))
    assert writes == [("memory.limit_in_bytes", str(128 * MIB))]


def test_a_lowered_limit_whose_memsw_write_fails_is_counted_as_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """memory.limit_in_bytes landed before memsw's write failed: the caller's
    ``written`` has it (before: left out, as if nothing had been written)."""
    from hooks.batchresource.apply import apply_values

    files = container(tmp_path, 256 * MIB, 256 * MIB)
    kernel_like(monkeypatch)
    real = CgroupFiles._write  # noqa: SLF001

    def memsw_refused(files: CgroupFiles, name: str, value: str) -> None:
        if name == MEMSW:
            raise OSError(errno.EBUSY, "Device or resource busy")
        real(files, name, value)

    monkeypatch.setattr(CgroupFiles, "_write", memsw_refused)
    written: list = []
    with pytest.raises(OSError, match="busy"):
        apply_values(files, limit(128 * MIB), lower_only=True, written=written)
    assert read(tmp_path, 1, "pod/c", "memory.limit_in_bytes") == str(128 * MIB)
    assert [(c.field, c.old, c.new) for c in written if c.field is Field.MEMORY_LIMIT] == [
        (Field.MEMORY_LIMIT, 256 * MIB, 128 * MIB)]


def test_both_from_unlimited_and_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory and memsw wanted together, -1/-1 to 128Mi/128Mi (the limit
    first) and back (memsw first). Guards existing behaviour."""
    files = container(tmp_path, UNLIMITED, UNLIMITED)
    writes = kernel_like(monkeypatch)
    files.write(Field.MEMORY_LIMIT, CgroupValues(2, UNLIMITED, 128 * MIB, memory_swap=128 * MIB))
    assert writes == [("memory.limit_in_bytes", str(128 * MIB)), (MEMSW, str(128 * MIB))]
    writes.clear()
    files.write(Field.MEMORY_LIMIT, CgroupValues(2, UNLIMITED, UNLIMITED, memory_swap=UNLIMITED))
    assert writes == [(MEMSW, "-1"), ("memory.limit_in_bytes", "-1")]
