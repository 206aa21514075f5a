"""The unix-socket rules shared by the proxy and the SDK.

Only ECONNREFUSED (or ENOENT) proves a socket stale; any other connect error
means "cannot tell" and the path is refused, never unlinked. Connect errors
root cannot provoke (EACCES) are injected here; tests/component/host/ gets
them for real from a process without privileges.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from hooks.sdk import HookServer, HookServerError
from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath.server import ListenError, Proxy, prepare_socket_path
from runtimeproxy.host import unixsocket
from runtimeproxy.host.unixsocket import (
    MAX_PATH,
    PathTooLong,
    SocketIdentity,
    UnixSocketError,
    grpc_address,
    grpc_target,
)
from tests.unixsockets import full_backlog, stale_socket


class FailingProbe:
    """Stands in for socket.socket: every connect fails with ``err``."""

    def __init__(self, err: int) -> None:
        self.err = err

    def __call__(self, *args: object, **kwargs: object) -> FailingProbe:
        return self

    def __enter__(self) -> FailingProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def connect_ex(self, address: object) -> int:
        return self.err

    def connect(self, address: object) -> None:
        raise OSError(self.err, os.strerror(self.err))

    def setblocking(self, flag: bool) -> None:
        pass

    def settimeout(self, value: float | None) -> None:
        pass

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- the rules


def test_path_length_limit(sock_dir: Path) -> None:
    assert MAX_PATH == 107
    fits = Path("/" + "x" * (MAX_PATH - 1))
    unixsocket.check_path_length(fits)
    with pytest.raises(PathTooLong, match=r"too long \(108 > 107 bytes\)"):
        unixsocket.check_path_length(Path(str(fits) + "y"))
    with pytest.raises(ValueError, match="too long"):
        unixsocket.prepare(sock_dir / ("x" * 120 + ".sock"))


def test_missing_directory_is_created(sock_dir: Path) -> None:
    path = sock_dir / "a" / "b" / "s.sock"
    unixsocket.prepare(path)
    assert path.parent.is_dir() and not path.exists()


def test_stale_socket_is_removed(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    stale_socket(path)
    unixsocket.prepare(path)
    assert not path.exists()


def test_regular_file_is_refused(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    path.write_text("precious")
    with pytest.raises(UnixSocketError, match="exists and is not a unix socket"):
        unixsocket.prepare(path)
    assert path.read_text() == "precious"


def test_live_socket_is_refused(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(8)
        with pytest.raises(UnixSocketError, match="in use by another process"):
            unixsocket.prepare(path)
    assert path.exists()


@pytest.mark.parametrize("below", ["file/s.sock", "file/a/b/s.sock"])
def test_a_file_in_the_way_of_the_directory_is_refused_naming_it(sock_dir: Path, below: str) -> None:
    (sock_dir / "file").write_text("precious")
    with pytest.raises(unixsocket.UnusablePath, match=f"^cannot create the directory of {sock_dir / below}: "
                                                      f"{sock_dir / 'file'} is not a directory$"):
        unixsocket.prepare(sock_dir / below)
    assert (sock_dir / "file").read_text() == "precious"


def test_a_directory_that_cannot_be_made_is_refused_without_a_raw_oserror(sock_dir: Path) -> None:
    with pytest.raises(unixsocket.UnixSocketError, match="cannot create the directory of /proc/runtime-proxy/s.sock: "):
        unixsocket.prepare(Path("/proc/runtime-proxy/s.sock"))


@pytest.mark.parametrize(
    ("err", "for_good"),
    [(errno.EROFS, False), (errno.EACCES, False), (errno.EPERM, False), (errno.ENOSPC, False),
     (errno.ENAMETOOLONG, True), (errno.ELOOP, True)],
    ids=lambda value: errno.errorcode[value] if isinstance(value, int) and not isinstance(value, bool) else str(value),
)
def test_only_a_directory_refused_for_what_the_path_is_is_unusable_for_good(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch, err: int, for_good: bool
) -> None:
    # A read-only /run early at boot, a directory another unit has not given
    # its mode yet: a restart may succeed (hook run exits 1 for those, 2 for UnusablePath).
    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(unixsocket.UnixSocketError, match=f": {os.strerror(err)}$") as raised:
        unixsocket.prepare(sock_dir / "sub" / "s.sock")
    assert isinstance(raised.value, unixsocket.UnusablePath) is for_good


def test_a_symlink_to_a_socket_is_refused_and_kept(sock_dir: Path) -> None:
    target = sock_dir / "real.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(target))
        link = sock_dir / "link.sock"
        link.symlink_to(target)
        with pytest.raises(unixsocket.UnusablePath, match=f"^{link} is a symbolic link, not a unix socket"):
            unixsocket.prepare(link)
    assert link.is_symlink() and target.exists()


@pytest.mark.parametrize(
    ("setup", "listen", "message"),
    [
        (lambda d: None, "x" * 120 + ".sock", "too long"),
        (lambda d: (d / "file").write_text(""), "file/a/s.sock", "file is not a directory"),
        (lambda d: (d / "s.sock").mkdir(), "s.sock", "exists and is not a unix socket"),
        (lambda d: (d / "s.sock").symlink_to(d / "elsewhere.sock"), "s.sock", "is a symbolic link"),
    ],
)
def test_check_bindable_refuses_what_prepare_refuses(
    sock_dir: Path, setup: Callable[[Path], object], listen: str, message: str
) -> None:
    setup(sock_dir)
    with pytest.raises(UnixSocketError, match=message):
        unixsocket.check_bindable(sock_dir / listen)
    with pytest.raises(UnixSocketError, match=message):
        unixsocket.prepare(sock_dir / listen)


def test_check_bindable_changes_nothing_and_asks_no_server(sock_dir: Path) -> None:
    unixsocket.check_bindable(sock_dir / "a" / "b" / "s.sock")
    assert not (sock_dir / "a").exists()  # prepare would make it
    stale_socket(sock_dir / "stale.sock")
    unixsocket.check_bindable(sock_dir / "stale.sock")
    assert (sock_dir / "stale.sock").is_socket()  # prepare would remove it
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(sock_dir / "live.sock"))
        listener.listen()
        unixsocket.check_bindable(sock_dir / "live.sock")  # the proxy's own, likely


@pytest.mark.parametrize("err", [errno.EACCES, errno.EAGAIN, errno.EPERM, errno.ECONNRESET])
def test_any_other_connect_error_is_refused_not_unlinked(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    path = sock_dir / "s.sock"
    identity = stale_socket(path)
    monkeypatch.setattr(socket, "socket", FailingProbe(err))
    with pytest.raises(UnixSocketError) as excinfo:
        unixsocket.prepare(path)
    monkeypatch.undo()
    message = str(excinfo.value)
    assert str(path) in message and errno.errorcode[err] in message and "cannot tell" in message
    assert SocketIdentity.of(path) == identity


def test_a_connect_that_does_not_finish_is_bounded(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = sock_dir / "s.sock"
    identity = stale_socket(path)
    waited: list[float] = []

    def never_writable(r: list, w: list, x: list, timeout: float) -> tuple[list, list, list]:
        waited.append(timeout)
        return [], [], []

    monkeypatch.setattr(socket, "socket", FailingProbe(errno.EINPROGRESS))
    monkeypatch.setattr(select, "select", never_writable)
    with pytest.raises(UnixSocketError, match="ETIMEDOUT"):
        unixsocket.prepare(path, timeout=0.25)
    monkeypatch.undo()
    assert waited == [0.25]
    assert SocketIdentity.of(path) == identity


async def test_full_backlog_is_refused_within_the_timeout(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    with full_backlog(path) as listener:
        identity = SocketIdentity.of(path)
        # EAGAIN at once: a probe that waited out its timeout says ETIMEDOUT
        # (before: also timed, which a loaded machine's thread start could exceed).
        with pytest.raises(UnixSocketError, match="EAGAIN") as excinfo:
            # In a thread: a probe that blocks must fail this test, not hang it.
            await asyncio.wait_for(asyncio.to_thread(unixsocket.prepare, path), 5)
        assert str(path) in str(excinfo.value)
        assert SocketIdentity.of(path) == identity
        listener.setblocking(False)
        conn, _ = listener.accept()  # its queued client is still there
        conn.close()


def test_remove_own_leaves_a_replaced_socket(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    ours = stale_socket(path)
    path.rename(sock_dir / "old.sock")  # kept, so that its inode is not reused at once
    theirs = stale_socket(path)
    assert not unixsocket.remove_own(path, ours)
    assert SocketIdentity.of(path) == theirs
    assert unixsocket.remove_own(path, theirs)
    assert not path.exists()
    assert not unixsocket.remove_own(path, theirs)  # already gone
    assert not unixsocket.remove_own(path, None)  # never bound


# --------------------------------------------------------------------------- the proxy and the SDK


def test_proxy_prepare_refuses_eacces(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = sock_dir / "proxy.sock"
    identity = stale_socket(path)
    monkeypatch.setattr(socket, "socket", FailingProbe(errno.EACCES))
    with pytest.raises(ListenError, match="EACCES"):
        prepare_socket_path(path)
    monkeypatch.undo()
    assert SocketIdentity.of(path) == identity


def proxy(path: Path) -> Proxy:
    return Proxy(ProxyConfig(listen=path, backend=path.with_name("backend.sock")))


@pytest.mark.parametrize(("make", "error"), [(proxy, ListenError), (HookServer, HookServerError)])
async def test_start_refuses_eacces(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch, make: Callable[[Path], Proxy | HookServer], error: type
) -> None:
    path = sock_dir / "s.sock"
    identity = stale_socket(path)
    server = make(path)
    try:
        monkeypatch.setattr(socket, "socket", FailingProbe(errno.EACCES))
        with pytest.raises(error, match=f"cannot tell whether {path} is in use.*EACCES"):
            await server.start()
        monkeypatch.undo()
        assert SocketIdentity.of(path) == identity
    finally:
        monkeypatch.undo()
        await server.stop(0)


async def test_proxy_and_sdk_refuse_a_full_backlog(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    with full_backlog(path):
        identity = SocketIdentity.of(path)
        with pytest.raises(HookServerError, match="EAGAIN"):
            await asyncio.wait_for(HookServer(path).start(), 5)
        with pytest.raises(ListenError, match="EAGAIN"):
            await asyncio.wait_for(asyncio.to_thread(prepare_socket_path, path), 5)
        assert SocketIdentity.of(path) == identity


# grpc decodes %XX in a unix address and target and cuts ?query and #fragment:
# unquoted, a#b.sock was dialled as a, x%41y.sock bound as xAy.sock.
@pytest.mark.parametrize("name", ["a#b.sock", "c?d.sock", "x%41y.sock", "s p.sock", "é.sock"])
async def test_a_socket_path_is_bound_and_dialled_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    server = aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    assert server.add_insecure_port(grpc_address(tmp_path / name)) != 0
    await server.start()
    try:
        assert [p.name for p in tmp_path.iterdir()] == [name]
        monkeypatch.chdir(tmp_path)
        for path in (tmp_path / name, Path(name)):  # a relative path from the current directory
            async with aio.insecure_channel(grpc_target(path)) as channel:
                answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(None)
