"""A proxy killed without a stop (SIGKILL, OOM) leaves its frames path's
private directory behind; the next start removes it, and only what it can
prove is a dead proxy's: a live proxy's directory, or one without a lock
file, a link or another mode, or one put in its place while it was checked,
stays (frames/privatedir.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath.server import Proxy
from runtimeproxy.frames import privatedir
from runtimeproxy.host.process import terminate_process

from ..fakes import FakeBackend
from ..test_process import wait_for_line


async def test_a_start_removes_a_killed_proxys_directory_and_keeps_a_live_ones(
    fake: FakeBackend, sock_dir: Path, temp_root: Path
) -> None:
    live = Proxy(ProxyConfig(listen=sock_dir / "live.sock", backend=fake.socket, data_path="frames"))
    await live.start()
    (live_dir,) = temp_root.iterdir()
    killed = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy.cli", "serve", "--listen", str(sock_dir / "killed.sock"),
        "--backend", str(fake.socket), "--hook-dir", str(sock_dir / "hooks.d"), "--data-path", "frames",
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "TMPDIR": str(temp_root)},
    )
    try:
        assert killed.stderr is not None
        await wait_for_line(killed.stderr, "serving v1 (native)")
        (killed_dir,) = set(temp_root.iterdir()) - {live_dir}
        killed.send_signal(signal.SIGKILL)
        await asyncio.wait_for(killed.wait(), 30)
    finally:
        await terminate_process(killed, 10, "serve")
    assert (killed_dir / "grpc.sock").exists()  # left behind

    second = Proxy(ProxyConfig(listen=sock_dir / "second.sock", backend=fake.socket, data_path="frames"))
    await second.start()
    try:
        assert not killed_dir.exists()
        (second_dir,) = set(temp_root.iterdir()) - {live_dir}
        assert second_dir.name.startswith(privatedir.PREFIX)
        assert (live_dir / "grpc.sock").exists()  # the live proxy's stays, and it still serves
        health = await _health(sock_dir / "live.sock")
        assert health == 1  # SERVING
    finally:
        await second.stop(0)
        await live.stop(0)
    assert list(temp_root.iterdir()) == []


async def _health(listen: Path) -> int:
    async with aio.insecure_channel(f"unix://{listen}") as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return int(answer.status)


def test_what_it_cannot_prove_dead_stays(tmp_path: Path) -> None:
    no_lock = tmp_path / f"{privatedir.PREFIX}nolock"
    no_lock.mkdir(mode=0o700)  # as a directory in the instant before its lock is made
    open_mode = tmp_path / f"{privatedir.PREFIX}mode"
    open_mode.mkdir(mode=0o755)
    (open_mode / privatedir.LOCK_NAME).touch()
    os.chmod(open_mode, 0o755)
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (target / privatedir.LOCK_NAME).touch()
    link = tmp_path / f"{privatedir.PREFIX}link"
    link.symlink_to(target)
    linked_lock = tmp_path / f"{privatedir.PREFIX}linkedlock"
    linked_lock.mkdir(mode=0o700)
    (linked_lock / privatedir.LOCK_NAME).symlink_to(target / privatedir.LOCK_NAME)
    other_name = tmp_path / "other-frames-x"
    other_name.mkdir(mode=0o700)
    (other_name / privatedir.LOCK_NAME).touch()
    dead = tmp_path / f"{privatedir.PREFIX}dead"
    dead.mkdir(mode=0o700)
    (dead / privatedir.LOCK_NAME).touch()
    (dead / "grpc.sock").touch()

    assert privatedir.sweep(tmp_path) == [dead]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        path.name for path in (no_lock, open_mode, target, link, linked_lock, other_name))
    assert (target / privatedir.LOCK_NAME).exists()


def test_a_held_lock_keeps_its_directory_and_a_removed_one_frees_it(tmp_path: Path) -> None:
    made = privatedir.make(tmp_path)
    assert sorted(p.name for p in made.path.iterdir()) == [privatedir.LOCK_NAME]  # named once locked
    assert privatedir.sweep(tmp_path) == []  # held (by another open file: flock is per open file)
    assert made.path.exists()
    made.remove()
    assert list(tmp_path.iterdir()) == []


def test_a_directory_replaced_while_checked_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The name is checked to still lead to the directory whose lock was
    taken: one put in its place meanwhile (a rename in the parent) is not
    removed, nor anything in it."""
    dead = tmp_path / f"{privatedir.PREFIX}dead"
    dead.mkdir(mode=0o700)
    (dead / privatedir.LOCK_NAME).touch()
    flock = privatedir.fcntl.flock

    def swapped(fd: int, operation: int) -> None:
        flock(fd, operation)
        dead.rename(tmp_path / "moved")
        dead.mkdir(mode=0o700)
        (dead / "precious").touch()

    monkeypatch.setattr(privatedir.fcntl, "flock", swapped)
    assert privatedir.sweep(tmp_path) == []
    assert (dead / "precious").exists() and (tmp_path / "moved" / privatedir.LOCK_NAME).exists()
