"""Two proxies (or hook servers) on one socket path.

The stale-socket check (unixsocket.prepare; remove_stale under the lock)
cannot see an instance between its own check and its bind; grpc's bind first unlinks what is at the path, and its
stop the path it bound. So each instance holds the path's lock
(host/socketlock.py) from before its check until after its stop: two starting
at once, one serves and the other is refused naming the first's pid; one
starting while another stops waits for that stop to end. A program that takes
no lock is still met by the check, and on the frames path by its bind
(EADDRINUSE); grpc's bind and stop still unlink such a program's socket
(docs/configuration.md). The socket keeps its name: ss and /proc/net/unix show
the bound name."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from grpc.aio._server import Server as GrpcServer

from hooks.frameserver import FrameServer
from hooks.sdk import TRANSPORTS, HookServer, HookServerError
from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath.server import ListenError, Proxy
from runtimeproxy.host import unixsocket

from ..fakes import FakeBackend


@pytest.mark.parametrize("data_path", ["frames"])  # grpc's own bind unlinks what is there (docs/configuration.md)
async def test_a_proxy_losing_the_bind_to_a_program_without_the_lock_fails_and_leaves_its_socket(
    fake: FakeBackend, sock_dir: Path, monkeypatch: pytest.MonkeyPatch, data_path: str
) -> None:
    listen = sock_dir / "proxy.sock"
    winner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    remove_stale = unixsocket.remove_stale

    def first_binds_meanwhile(path: Path, timeout: float = unixsocket.PROBE_TIMEOUT) -> None:
        remove_stale(path, timeout)  # finds the path free...
        winner.bind(str(path))  # ...and a program that takes no lock binds it just then
        winner.listen()
        winner.settimeout(5)  # the accept below fails, rather than hangs, if the client reached another socket

    monkeypatch.setattr(unixsocket, "remove_stale", first_binds_meanwhile)
    with winner:
        proxy = Proxy(ProxyConfig(listen=listen, backend=fake.socket, hook_dir=sock_dir / "hooks", data_path=data_path))
        with pytest.raises(ListenError, match=f"^cannot listen on {listen}: Address already in use$"):
            await proxy.start()
        # The winner's socket is still at the path, and still the one clients reach.
        assert unixsocket.SocketIdentity.of(listen) == unixsocket.SocketIdentity.of(Path(winner.getsockname()))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(listen))
            accepted, _ = winner.accept()
            accepted.close()
    assert sorted(p.name for p in sock_dir.iterdir()) == ["backend.sock", "proxy.sock"]  # nothing left behind


@pytest.mark.parametrize("transport", ["frames"])  # as above, grpc's own bind
async def test_a_hook_server_losing_the_bind_to_a_program_without_the_lock_fails_and_leaves_its_socket(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    path = sock_dir / "hook.sock"
    winner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    remove_stale = unixsocket.remove_stale

    def first_binds_meanwhile(at: Path, timeout: float = unixsocket.PROBE_TIMEOUT) -> None:
        remove_stale(at, timeout)
        if at == path:
            winner.bind(str(at))
            winner.listen()

    monkeypatch.setattr(unixsocket, "remove_stale", first_binds_meanwhile)
    with winner:
        with pytest.raises(HookServerError, match=f"^cannot listen on {path}: Address already in use$"):
            await HookServer(path, transport=transport).start()
        assert unixsocket.SocketIdentity.of(path) == unixsocket.SocketIdentity.of(Path(winner.getsockname()))
    assert sorted(p.name for p in sock_dir.iterdir()) == ["hook.sock"]


# A newer program that takes no lock: grpc unlinks the path it bound as it stops, whoever's it is then.
@pytest.mark.parametrize("data_path", ["frames"])
async def test_a_proxy_that_stops_leaves_a_newer_programs_socket(fake: FakeBackend, sock_dir: Path, data_path: str) -> None:
    listen = sock_dir / "proxy.sock"
    proxy = Proxy(ProxyConfig(listen=listen, backend=fake.socket, hook_dir=sock_dir / "hooks", data_path=data_path))
    await proxy.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as newer:
        listen.unlink()  # a newer instance took the path over (its stale check met an old proxy stuck)
        newer.bind(str(listen))
        newer.listen()
        await proxy.stop(0)
        assert unixsocket.SocketIdentity.of(listen) == unixsocket.SocketIdentity.of(Path(newer.getsockname()))


@pytest.mark.parametrize("transport", ["frames"])  # as above
async def test_a_hook_server_that_stops_leaves_a_newer_programs_socket(sock_dir: Path, transport: str) -> None:
    path = sock_dir / "hook.sock"
    server = HookServer(path, transport=transport)
    await server.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as newer:
        path.unlink()
        newer.bind(str(path))
        newer.listen()
        await server.stop(0)
        assert unixsocket.SocketIdentity.of(path) == unixsocket.SocketIdentity.of(Path(newer.getsockname()))


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_socket_a_hook_server_owns_is_the_one_it_bound_not_one_bound_there_as_it_started(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    """Another program binds the path while the start awaits its listener's
    start (ours unlinked meanwhile): the server's socket is the one it
    bound, and a frames server's stop leaves the other's (grpc's stop
    unlinks the path by name, whoever bound it). Before: read once the
    transport's start returned, the other's socket was taken as ours and
    removed at the stop."""
    path = sock_dir / "hook.sock"
    newer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound: list[unixsocket.SocketIdentity] = []
    cls: Any = FrameServer if transport == "frames" else GrpcServer
    real_start = cls.start

    def replace() -> None:
        bound.append(unixsocket.SocketIdentity.of(path))
        path.unlink()
        newer.bind(str(path))
        newer.listen()

    async def start(self: Any, *args: Any) -> Any:
        if transport == "grpc":  # bound by add_insecure_port, not yet listening
            replace()
        started = await real_start(self, *args)
        if transport == "frames":  # listening: the start's last await
            replace()
        return started

    monkeypatch.setattr(cls, "start", start)
    server = HookServer(path, transport=transport)
    try:
        await server.start()
        monkeypatch.undo()
        assert server._socket_identity == bound[0]
        await server.stop(0)
        if transport == "frames":
            assert unixsocket.SocketIdentity.of(path) == unixsocket.SocketIdentity.of(Path(newer.getsockname()))
    finally:
        newer.close()


def _longest(base: Path, name: str) -> Path:
    """``base``/ddd.../``name``, MAX_PATH bytes long (the directory made)."""
    room = unixsocket.MAX_PATH - len(bytes(base)) - 2 - len(name)
    path = base / ("d" * room) / name
    path.parent.mkdir()
    assert len(bytes(path)) == unixsocket.MAX_PATH
    return path


def _bound_names() -> set[str]:
    """The names unix sockets are bound to, as ss -xl and /proc/net/unix show them."""
    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    return {fields[7] for fields in (line.split() for line in lines) if len(fields) > 7}


# grpc's bind of unix://PATH took "//PATH" for the path (105 bytes at most): the address is unix:PATH now.
@pytest.mark.parametrize("name", ["p.sock", "p"])
@pytest.mark.parametrize("data_path", ["frames", "grpc"])
async def test_a_listen_path_at_the_kernels_limit_serves_under_its_own_name(
    fake: FakeBackend, sock_dir: Path, data_path: str, name: str
) -> None:
    listen = _longest(sock_dir, name)
    unixsocket.check_bindable(listen)  # what check-config says
    proxy = Proxy(ProxyConfig(listen=listen, backend=fake.socket, hook_dir=sock_dir / "hooks", data_path=data_path))
    await proxy.start()
    try:
        assert str(listen) in _bound_names()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(listen))
    finally:
        await proxy.stop(0)
    assert sorted(p.name for p in listen.parent.iterdir()) == []  # removed at stop, and its lock


@pytest.mark.parametrize("name", ["h.sock", "h"])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_hook_socket_at_the_kernels_limit_serves_under_its_own_name(
    sock_dir: Path, transport: str, name: str
) -> None:
    path = _longest(sock_dir, name)
    server = HookServer(path, transport=transport)
    await server.start()
    try:
        assert path.is_socket() and str(path) in _bound_names()
    finally:
        await server.stop(0)
    assert sorted(p.name for p in path.parent.iterdir()) == []
