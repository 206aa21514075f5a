"""What a socket path's lock file says of its holder (host/lockholder.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtimeproxy.host.lockholder import Holder, read_holder, write_holder


NONCE = "0123456789abcdef"


def written(path: Path, stop_s: float | None) -> bytes:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        write_holder(fd, os.fstat(fd), stop_s, NONCE)
    finally:
        os.close(fd)
    return path.read_bytes()


def read(path: Path) -> Holder:
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_holder(fd)
    finally:
        os.close(fd)


def test_an_older_versions_reader_finds_the_pid_in_the_first_32_bytes(tmp_path: Path) -> None:
    # Its reader (dirlock's pid reader before stop_s): a rollback still names the holder.
    data = written(tmp_path / "lock", 17.5)
    assert data[32:] == f"holder={NONCE}\nstop_s=17.5\n".encode()
    assert int(data[:32].decode().strip()) == os.getpid()
    assert read(tmp_path / "lock") == Holder(os.getpid(), 17.5, NONCE)


def test_a_shorter_record_written_over_a_longer_one_leaves_nothing_of_it(tmp_path: Path) -> None:
    (tmp_path / "lock").write_text("1\nstop_s=1234567.25\ngarbage, a crashed holder's or another program's\n")
    written(tmp_path / "lock", None)
    assert read(tmp_path / "lock") == Holder(os.getpid(), None, NONCE)
    assert len((tmp_path / "lock").read_bytes()) == 32 + len(f"holder={NONCE}\n")


def test_an_older_holders_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "lock").write_text("123\n")
    assert read(tmp_path / "lock") == Holder(123, None)


@pytest.mark.parametrize("nonce", ["", "0123", "0123456789abcdeX", "0123456789abcdef0"])
def test_a_record_whose_nonce_is_not_whole_is_not_read_at_all(tmp_path: Path, nonce: str) -> None:
    # Read as it is written (pread is not atomic against pwrite): the waiter
    # keeps the holder it knew rather than take a half-written one for another.
    (tmp_path / "lock").write_text(f"123\nholder={nonce}\nstop_s=5\n")
    assert read(tmp_path / "lock") == Holder(None, None)


@pytest.mark.parametrize("value", ["inf", "-inf", "Infinity", "nan", "1e400"])
def test_a_stop_that_is_no_finite_number_is_not_read(tmp_path: Path, value: str) -> None:
    # It would be logged as the holder's stop: JSON has no Infinity nor NaN.
    (tmp_path / "lock").write_text(f"123\nstop_s={value}\n")
    assert read(tmp_path / "lock") == Holder(123, None)


def test_the_record_is_written_over_then_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Cut first, a reader could meet an empty file (no pid, no stop) between the two.
    calls: list[str] = []
    pwrite, ftruncate = os.pwrite, os.ftruncate
    monkeypatch.setattr(os, "pwrite", lambda *args: calls.append("pwrite") or pwrite(*args))
    monkeypatch.setattr(os, "ftruncate", lambda *args: calls.append("ftruncate") or ftruncate(*args))
    written(tmp_path / "lock", 17.5)
    assert calls == ["pwrite", "ftruncate"]


def test_a_file_with_another_name_is_not_written(tmp_path: Path) -> None:
    # A hard link someone made to another file: that file must not be overwritten.
    (tmp_path / "other").write_text("someone's\n")
    os.link(tmp_path / "other", tmp_path / "lock")
    written(tmp_path / "lock", 17.5)
    assert (tmp_path / "other").read_text() == "someone's\n"


def test_a_record_is_taken_only_when_two_reads_in_a_row_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first read meets the record as it is written: the pid line alone.
    written(tmp_path / "lock", 17.5)
    reads = [(tmp_path / "lock").read_bytes()[:32]]
    pread = os.pread
    monkeypatch.setattr(os, "pread", lambda *args: reads.pop(0) if reads else pread(*args))
    assert read(tmp_path / "lock") == Holder(None, None)
    assert read(tmp_path / "lock") == Holder(os.getpid(), 17.5, NONCE)
