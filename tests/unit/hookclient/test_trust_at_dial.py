"""Both transports judge a hook socket's owner (hookclient/endpointtrust.py):
frames when it dials a connection, grpc.aio at every call (it redials behind
our back). Real sockets, really chowned (the tests run as root)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from cri_api.hookapi import api_pb2 as hookapi
from hooks.sdk import HookServer
from runtimeproxy.hookclient import pool
from runtimeproxy.hookclient.endpointtrust import SocketSeen, look
from runtimeproxy.hookclient.pool import FramesTransport
from runtimeproxy.hookclient.transport import CallFailed, HookTransport, Untrusted, transport_for
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType

from ...hookprocs import NOBODY
from ...prerequisites import fail_or_skip

METHOD = HOOK_POINTS[HookType.PRE_CREATE_CONTAINER].full_method
REQUEST = hookapi.ContainerResourceHookRequest().SerializeToString()


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        fail_or_skip("needs root to chown sockets (CI runs as root)")


class Counting(HookServer):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls = 0

    async def pre_create_container(
        self, request: hookapi.ContainerResourceHookRequest
    ) -> hookapi.ContainerResourceHookResponse:
        self.calls += 1
        return hookapi.ContainerResourceHookResponse()


@pytest.fixture(params=["frames", "grpc"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[HookTransport]:
    transport = transport_for(request.param)
    yield transport
    await transport.close(1)


async def test_a_socket_another_user_owns_is_refused(tmp_path: Path, client: HookTransport) -> None:
    async with Counting(tmp_path / "h.sock") as server:
        os.chown(server.socket_path, NOBODY, NOBODY)
        with pytest.raises(Untrusted) as err:
            await client.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=None)
        assert err.value.reason == f"untrusted endpoint: socket {server.socket_path} is owned by uid {NOBODY}, not root"
        assert server.calls == 0
        if isinstance(client, FramesTransport):
            assert client.endpoints() == frozenset(), "refused before it was dialled"
        # Trusted for a hook file that user owns.
        await client.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=NOBODY)
        assert server.calls == 1


async def test_frames_judges_a_replaced_socket_at_the_next_dial(tmp_path: Path) -> None:
    transport = FramesTransport()
    path = tmp_path / "h.sock"
    try:
        async with Counting(path) as trusted:
            await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
            conn = transport._connections[str(path)]
            # Owned by someone else now, but the connection is to the server judged when it was dialled.
            os.chown(path, NOBODY, NOBODY)
            await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
            assert trusted.calls == 2
        await conn.lost  # that server is gone: the next call dials
        async with Counting(path) as squatter:
            os.chown(path, NOBODY, NOBODY)
            with pytest.raises(Untrusted, match=f"owned by uid {NOBODY}"):
                await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
            assert squatter.calls == 0
            assert transport.endpoints() == frozenset()
            os.chown(path, 0, 0)  # put right: the next call dials and is judged again
            await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
            assert squatter.calls == 1
    finally:
        await transport.close(1)


async def test_frames_judges_a_new_owner_by_the_socket_it_dialled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hook file reloaded with another owner (or a second file on the same
    endpoint) is judged by the connected socket as it was dialled. Refused,
    it is dialled anew once the path is put right, the connection replaced
    (before: refused until that connection ended, chowned back or not)."""
    dials: list[object] = []
    real_peer_of = pool.peer_of
    monkeypatch.setattr(pool, "peer_of", lambda sock: dials.append(sock) or real_peer_of(sock))
    transport = FramesTransport()
    try:
        async with Counting(tmp_path / "h.sock") as server:
            os.chown(server.socket_path, NOBODY, NOBODY)
            await transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=NOBODY)
            first = transport._connections[server.socket_path]
            for _ in range(3):
                with pytest.raises(Untrusted, match=f"owned by uid {NOBODY}"):
                    await transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=1000)
            assert len(dials) == 1, "still untrusted: not dialled"
            assert transport._connections[server.socket_path] is first
            os.chown(server.socket_path, 0, 0)  # put right: the path looks trusted now
            await transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=1000)
            second = transport._connections[server.socket_path]
            assert second is not first
            await first.lost  # the one replaced goes away once its calls are done (none here)
            await transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=NOBODY)
            assert transport._connections[server.socket_path] is second, "judged for its owner too"
            assert server.calls == 3
    finally:
        await transport.close(1)


async def test_grpc_judges_every_call(tmp_path: Path) -> None:
    transport = transport_for("grpc")
    try:
        async with Counting(tmp_path / "h.sock") as server:
            await transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=None)
            os.chown(server.socket_path, NOBODY, NOBODY)
            with pytest.raises(Untrusted):
                await transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=None)
            assert server.calls == 1
    finally:
        await transport.close(1)


@pytest.mark.parametrize("root_first", [True, False], ids=["root-dials", "nobody-dials"])
async def test_calls_waiting_on_one_dial_are_each_judged_for_their_own_hook_file(
    tmp_path: Path, root_first: bool
) -> None:
    """Two hook files on one endpoint, the socket nobody's: whichever owner's
    call dials, root's file is refused with its own reason and nobody's file
    is called (before: a call waiting on the dial got the dialler's refusal)."""
    transport = FramesTransport()
    try:
        async with Counting(tmp_path / "h.sock") as server:
            os.chown(server.socket_path, NOBODY, NOBODY)
            owners = [0, NOBODY] if root_first else [NOBODY, 0]
            results = await asyncio.gather(
                *(transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=owner) for owner in owners),
                return_exceptions=True,
            )
            by_owner = dict(zip(owners, results, strict=True))
            assert by_owner[NOBODY] == b"", by_owner[NOBODY]
            assert isinstance(by_owner[0], Untrusted)
            assert by_owner[0].reason == (
                f"untrusted endpoint: socket {server.socket_path} is owned by uid {NOBODY}, not root"
            )
            assert server.calls == 1
    finally:
        await transport.close(1)


class Accepting:
    """A unix socket server that only counts the connections it accepts."""

    def __init__(self) -> None:
        self.accepted = 0

    def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        writer.close()


async def test_an_untrusted_socket_is_never_dialled(tmp_path: Path) -> None:
    path = tmp_path / "h.sock"
    accepting = Accepting()
    server = await asyncio.start_unix_server(accepting, str(path))
    transport = FramesTransport()
    try:
        os.chown(path, NOBODY, NOBODY)
        with pytest.raises(Untrusted, match=f"owned by uid {NOBODY}"):
            await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
        # A connection dialled would have been accepted (and closed) before its call ended.
        assert accepting.accepted == 0
    finally:
        await transport.close(1)
        server.close()
        await server.wait_closed()


async def test_a_socket_that_appears_as_it_is_dialled_is_judged_once_connected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing at the path when looked at, an untrusted socket by the connect:
    the connection is judged by the one that appeared, and closed."""
    looks: list[SocketSeen | None] = []

    def first_finds_nothing(endpoint: str) -> SocketSeen | None:
        seen = look(endpoint) if looks else None
        looks.append(seen)
        return seen

    monkeypatch.setattr(pool, "look", first_finds_nothing)
    transport = FramesTransport()
    try:
        async with Counting(tmp_path / "h.sock") as server:
            os.chown(server.socket_path, NOBODY, NOBODY)
            with pytest.raises(Untrusted, match=f"owned by uid {NOBODY}"):
                await transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=None)
            assert len(looks) == 2 and looks[1] is not None
            assert server.calls == 0
            assert transport.endpoints() == frozenset()
    finally:
        await transport.close(1)


async def test_a_socket_gone_at_the_look_after_connecting_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connected, yet nothing at the path to judge: UNAVAILABLE, the connection
    closed (before: trusted for every hook file owner for its life)."""
    monkeypatch.setattr(pool, "look", lambda endpoint: None)
    transport = FramesTransport()
    try:
        async with Counting(tmp_path / "h.sock") as server:
            with pytest.raises(CallFailed) as err:
                await transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=None)
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
            assert err.value.details == f"cannot connect to {server.socket_path}: socket vanished as it was dialled"
            assert server.calls == 0
            assert transport.endpoints() == frozenset()
    finally:
        await transport.close(1)


async def test_a_symlink_chain_dials_the_socket_that_was_judged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint is a link to a link in a world-writable directory (which
    the look follows, judging only the first link's directory and the
    socket's). That link retargeted at another user's socket between the
    look and the connect: the connection is still to the socket judged.
    Before: the endpoint itself was dialled, its chain followed afresh, and
    the squatter's socket was called as trusted."""
    trusted_dir, open_dir, hooks = tmp_path / "trusted", tmp_path / "open", tmp_path / "hooks"
    for directory, mode in ((trusted_dir, 0o755), (open_dir, 0o1777), (hooks, 0o755)):
        directory.mkdir()
        directory.chmod(mode)
    middle, endpoint = open_dir / "mid", hooks / "h.sock"
    middle.symlink_to(trusted_dir / "real.sock")
    endpoint.symlink_to(middle)

    def look_then_retarget(path: str) -> SocketSeen | None:
        seen = look(path)
        retarget = open_dir / "mid.new"  # as a user writing to the open directory would
        retarget.symlink_to(trusted_dir / "squat.sock")
        os.replace(retarget, middle)
        return seen

    monkeypatch.setattr(pool, "look", look_then_retarget)
    transport = FramesTransport()
    try:
        async with Counting(trusted_dir / "real.sock") as real, Counting(trusted_dir / "squat.sock") as squatter:
            os.chown(squatter.socket_path, NOBODY, NOBODY)
            await transport.call(str(endpoint), METHOD, REQUEST, 5, owner_uid=None)
            assert (real.calls, squatter.calls) == (1, 0)
    finally:
        await transport.close(1)


async def test_a_short_link_to_a_socket_too_deep_to_dial_is_dialled_by_the_link(tmp_path: Path) -> None:
    """The endpoint is a short link to a socket whose own path is longer
    than a unix address holds (108 bytes): the link is dialled, as before
    the pool dialled the judged socket (before: UNAVAILABLE, "AF_UNIX path
    too long", for an endpoint that had always connected)."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    assert len(os.fsencode(deep / "h.sock")) > pool.SUN_PATH_MAX
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    endpoint = tmp_path / "h.sock"
    endpoint.symlink_to(deep / "h.sock")
    transport = FramesTransport()
    try:
        # Bound through /proc (a short path to the deep directory), as a server started in it would be.
        async with Counting(Path(f"/proc/self/fd/{fd}/h.sock")) as server:
            await transport.call(str(endpoint), METHOD, REQUEST, 5, owner_uid=None)
            assert server.calls == 1
    finally:
        await transport.close(1)
        os.close(fd)
