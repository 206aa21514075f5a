"""The frames transport judges who serves a socket once connected
(``SO_PEERCRED``, endpointtrust.require_peer), closing the gap between the
look at the path and the connect. The other users' servers are real
processes run as nobody (the tests run as root)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtimeproxy.hookclient import pool
from runtimeproxy.hookclient.endpointtrust import SocketSeen, look
from runtimeproxy.hookclient.pool import FramesTransport
from runtimeproxy.hookclient.transport import Untrusted, transport_for

from ...hookprocs import NOBODY, dir_for_nobody, served_by_nobody
from ...prerequisites import fail_or_skip
from .test_trust_at_dial import METHOD, REQUEST, Counting

@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        fail_or_skip("needs root to run a server as another user (CI runs as root)")


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    with dir_for_nobody() as path:
        yield path


async def test_a_socket_swapped_in_between_the_look_and_the_connect_is_refused(
    nobody_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path judged trusted (root's server), then nobody's socket moved
    there before the connect: refused once connected, as the server that
    answered is nobody's, the connection closed, no call made (before:
    called, nobody answering for every pod)."""
    endpoint, squat = nobody_dir / "h.sock", nobody_dir / "squat.sock"
    looks: list[SocketSeen | None] = []

    def look_then_swap(path: str) -> SocketSeen | None:
        seen = look(path)
        looks.append(seen)
        os.replace(squat, endpoint)  # as nobody could: the directory is theirs
        return seen

    transport = FramesTransport()
    try:
        async with Counting(endpoint) as trusted, served_by_nobody(squat) as squatter:
            monkeypatch.setattr(pool, "look", look_then_swap)
            with pytest.raises(Untrusted) as err:
                await transport.call(str(endpoint), METHOD, REQUEST, 5, owner_uid=None)
            assert looks[0] is not None and looks[0].uid == 0, "judged trusted at the look"
            assert err.value.reason == (
                f"untrusted endpoint: the server connected to at {endpoint}: pid {squatter.process.pid} "
                f"listened on it as uid {NOBODY}, not root; was the socket replaced after it was checked, or is it "
                "listened on by a user not trusted to own it?"
            )
            assert err.value.peer is not None and err.value.peer.uid == NOBODY
            assert transport.endpoints() == frozenset()
            assert trusted.calls == 0
        assert squatter.calls == 0
    finally:
        await transport.close(1)


async def test_a_root_owned_socket_served_by_the_hook_files_owner_is_called(nobody_dir: Path) -> None:
    """A socket chowned to root, served by the hook file's owner: called for
    that owner's file, on the grpc path as on frames. Guards existing
    behaviour (the peer check must not refuse it)."""
    endpoint = nobody_dir / "h.sock"
    frames, grpc_path = FramesTransport(), transport_for("grpc")
    try:
        async with served_by_nobody(endpoint) as server:
            os.chown(endpoint, 0, 0)
            assert await frames.call(str(endpoint), METHOD, REQUEST, 5, owner_uid=NOBODY) == b""
            assert await grpc_path.call(str(endpoint), METHOD, REQUEST, 5, owner_uid=NOBODY) == b""
        assert server.calls == 2
    finally:
        await frames.close(1)
        await grpc_path.close(1)


@pytest.mark.parametrize("dialled_for_nobody_first", [False, True], ids=["at-dial", "pooled"])
async def test_a_root_owned_socket_served_by_another_user_is_refused(
    nobody_dir: Path, dialled_for_nobody_first: bool
) -> None:
    """Root owns the socket but nobody serves it: refused for a hook file of
    root's, whether it dials or finds the connection another file's owner
    dialled (before: called, the socket's owner being all that was judged)."""
    endpoint = nobody_dir / "h.sock"
    transport = FramesTransport()
    try:
        async with served_by_nobody(endpoint) as server:
            os.chown(endpoint, 0, 0)
            if dialled_for_nobody_first:
                await transport.call(str(endpoint), METHOD, REQUEST, 5, owner_uid=NOBODY)
            with pytest.raises(Untrusted, match=f": pid {server.process.pid} listened on it as uid {NOBODY}, not root;"):
                await transport.call(str(endpoint), METHOD, REQUEST, 5, owner_uid=None)
            expected = {str(endpoint)} if dialled_for_nobody_first else set()
            assert transport.endpoints() == expected
        assert server.calls == int(dialled_for_nobody_first)
    finally:
        await transport.close(1)


@pytest.mark.parametrize("root_first", [True, False], ids=["root-dials", "nobody-dials"])
async def test_calls_waiting_on_one_dial_are_each_judged_by_its_server(nobody_dir: Path, root_first: bool) -> None:
    """Root's socket served by nobody, a hook file of each on it: whichever
    dials, root's is refused for the server and nobody's is called."""
    endpoint = nobody_dir / "h.sock"
    transport = FramesTransport()
    try:
        async with served_by_nobody(endpoint) as server:
            os.chown(endpoint, 0, 0)
            owners = [0, NOBODY] if root_first else [NOBODY, 0]
            results = await asyncio.gather(
                *(transport.call(str(endpoint), METHOD, REQUEST, 5, owner_uid=owner) for owner in owners),
                return_exceptions=True,
            )
            by_owner = dict(zip(owners, results, strict=True))
            assert by_owner[NOBODY] == b"", by_owner[NOBODY]
            assert isinstance(by_owner[0], Untrusted), by_owner[0]
            assert f"listened on it as uid {NOBODY}, not root;" in by_owner[0].reason
        assert server.calls == 1
    finally:
        await transport.close(1)
