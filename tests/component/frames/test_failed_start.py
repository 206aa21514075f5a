"""A proxy whose start fails leaves nothing on disk: the frames path's private
directory (for its internal grpc socket) is made only by a start, and removed
when that start fails; the proxy is stopped only once started (app.py)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
from pathlib import Path

import pytest

from runtimeproxy.app import build_proxy
from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath import server as server_module
from runtimeproxy.cripath.server import ListenError, Proxy
from runtimeproxy.frames import path as frames_path
from runtimeproxy.frames.listener import FramesListener

from ...grpcstarts import cancelling_as_grpc_starts
from ..fakes import FakeBackend


async def test_a_listen_path_in_use_leaves_no_temp_dir(fake: FakeBackend, sock_dir: Path, temp_root: Path) -> None:
    listen = sock_dir / "proxy.sock"
    with socket.socket(socket.AF_UNIX) as other:  # another proxy serves there
        other.bind(str(listen))
        other.listen()
        config = ProxyConfig(listen=listen, backend=fake.socket, hook_dir=sock_dir / "hooks", data_path="frames")
        with pytest.raises(ListenError, match="in use"):
            async with contextlib.AsyncExitStack() as stack:
                await build_proxy(config, stack)
    assert list(temp_root.iterdir()) == []


async def test_a_listener_that_cannot_start_leaves_no_temp_dir_nor_server(
    fake: FakeBackend, sock_dir: Path, temp_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def cannot_start(self: FramesListener, sock: socket.socket | None = None) -> None:
        raise OSError("injected: cannot listen")

    monkeypatch.setattr(FramesListener, "start", cannot_start)
    proxy = Proxy(ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, data_path="frames"))
    with pytest.raises(ListenError, match="cannot listen on .*: injected"):  # one line for the operator
        await proxy.start()
    assert list(temp_root.iterdir()) == []
    # Its grpc server, started first on the internal socket, was stopped (False: did not time out).
    assert await proxy.server.wait_for_termination(5) is False


async def test_a_started_proxy_removes_its_temp_dir_when_it_stops(
    fake: FakeBackend, sock_dir: Path, temp_root: Path
) -> None:
    proxy = Proxy(ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, data_path="frames"))
    assert list(temp_root.iterdir()) == []  # nothing before a start
    await proxy.start()
    (made,) = temp_root.iterdir()
    assert made.name.startswith("runtime-proxy-frames-") and (made / "grpc.sock").exists()
    await proxy.stop(0)
    assert list(temp_root.iterdir()) == []


async def test_a_step_failing_after_the_frames_path_started_leaves_no_temp_dir_nor_server(
    fake: FakeBackend, sock_dir: Path, temp_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The socket's mode is set after the frames path started on it.
    def cannot_chmod(path: object, mode: int) -> None:
        raise PermissionError("injected: cannot chmod")

    monkeypatch.setattr(server_module.os, "chmod", cannot_chmod)
    proxy = Proxy(ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, data_path="frames"))
    with pytest.raises(PermissionError, match="injected"):
        await proxy.start()
    assert list(temp_root.iterdir()) == []
    assert await proxy.server.wait_for_termination(5) is False


async def test_a_start_cancelled_as_its_internal_grpc_server_starts_leaves_no_temp_dir_nor_server(
    fake: FakeBackend, sock_dir: Path, temp_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = Proxy(ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, data_path="frames"))
    task = asyncio.ensure_future(proxy.start())
    with cancelling_as_grpc_starts(task) as fired:  # at grpc's one await in its start
        with pytest.raises(asyncio.CancelledError):
            await task
    assert fired == [True]
    assert list(temp_root.iterdir()) == []
    # Stopped before the start ended (False: did not time out), and no grpc crash to raise.
    assert await proxy.server.wait_for_termination(0) is False
    assert "InvalidStateError" not in caplog.text


async def test_a_tmpdir_with_a_comma_puts_the_internal_socket_below_a_base_without_one(
    fake: FakeBackend, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the start failed dialling TMPDIR/runtime-proxy-frames-*/grpc.sock
    (grpc splits a path at a comma), a path the operator never named."""
    with_comma, base = sock_dir / "t,mp", sock_dir / "base"
    with_comma.mkdir()
    base.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(with_comma))
    monkeypatch.setattr(frames_path, "COMMA_FREE_BASE", base)  # /tmp, not for a test
    proxy = Proxy(ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, data_path="frames"))
    await proxy.start()
    (made,) = base.iterdir()
    assert made.name.startswith("runtime-proxy-frames-") and (made / "grpc.sock").exists()
    assert list(with_comma.iterdir()) == []
    await proxy.stop(0)
    assert list(base.iterdir()) == []


async def test_a_private_directory_that_cannot_be_made_names_its_base_and_tmpdir_not_listen(
    fake: FakeBackend, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `cannot listen on <listen>: No such file or directory`, naming a path that was fine."""
    with_comma, base = sock_dir / "t,mp", sock_dir / "gone"
    with_comma.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(with_comma))
    monkeypatch.setattr(frames_path, "COMMA_FREE_BASE", base)  # as a /tmp that cannot be used
    listen = sock_dir / "proxy.sock"
    proxy = Proxy(ProxyConfig(listen=listen, backend=fake.socket, data_path="frames"))
    with pytest.raises(ListenError) as failed:
        await proxy.start()
    assert str(failed.value) == (f"cannot make the frames path's private directory in {base} "
                                 f"(TMPDIR {with_comma} has a comma): No such file or directory")
    assert not listen.exists()
