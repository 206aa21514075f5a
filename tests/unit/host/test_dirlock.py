"""The lock that gives one runtime-proxy at a time a `--local-containerd` directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtimeproxy.host.dirlock import LOCK_NAME, DirectoryInUse, DirectoryLock

# Takes the lock, says so, and holds it until its stdin closes.
HOLDER = """\
import sys
from pathlib import Path
from runtimeproxy.host.dirlock import DirectoryLock
lock = DirectoryLock.acquire(Path(sys.argv[1]))
print("held", flush=True)
sys.stdin.read()
"""


def test_the_lock_records_its_holder_and_refuses_a_second_taker(tmp_path: Path) -> None:
    lock = DirectoryLock.acquire(tmp_path)
    try:
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        # flock belongs to an open file, not a process: the same process is refused too.
        with pytest.raises(DirectoryInUse) as refused:
            DirectoryLock.acquire(tmp_path)
        assert refused.value.directory == tmp_path and refused.value.holder == os.getpid()
        assert str(tmp_path) in str(refused.value) and f"pid {os.getpid()}" in str(refused.value)
    finally:
        lock.release()
    again = DirectoryLock.acquire(tmp_path)  # released: free for the next run
    again.release()
    again.release()  # idempotent


def test_a_holder_that_dies_frees_the_directory(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(DirectoryInUse, match=f"pid {holder.pid}"):
            DirectoryLock.acquire(tmp_path)
    finally:
        holder.kill()  # no release(): the kernel drops the lock with its last descriptor
        holder.wait()
    # Its pid is still in the file; a taker overwrites it.
    lock = DirectoryLock.acquire(tmp_path)
    try:
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    finally:
        lock.release()


def test_a_holder_not_yet_recorded_is_named_unknown(tmp_path: Path) -> None:
    lock = DirectoryLock.acquire(tmp_path)
    try:
        (tmp_path / LOCK_NAME).write_text("")  # as between its flock and its write
        with pytest.raises(DirectoryInUse, match="pid unknown") as refused:
            DirectoryLock.acquire(tmp_path)
        assert refused.value.holder is None
    finally:
        lock.release()
