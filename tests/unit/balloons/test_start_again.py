"""A BalloonsHook whose start failed once it held its socket's lock starts
again on the same object once the cause is gone, and serves: hook calls
answered, its runtime client listing again, its saved-set writer writing
(before: "used once", the runtime client and the writer closed for good by
the failed start's release step; only a new object could serve). One that
served and was stopped stays used once (test_saved_at_stop.py). Two
starts under way share one, the status socket's included.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from cri_api.hookapi import api_pb2_grpc
from cri_api.v1 import api_pb2 as v1
from hooks.balloons.config import parse_config
from hooks.balloons.runtime import RuntimeClient
from hooks.balloons.server import BalloonsHook
from hooks.balloons.status import read_status
from hooks.balloons.topology import Topology
from hooks.errors import HookServerError
from runtimeproxy.host import socketlock
from tests.unixsockets import another_instance_serving, socket_mode_fails

from .test_saved_reserved import ALONE, saved_in, written
from .test_server import request

WAIT = 10.0  # at most, for what must happen: a failure, not a hang


class EmptyStub:
    """A runtime with no pod: the start-up rebuild finds nothing running."""

    def __init__(self) -> None:
        self.listings = 0

    async def ListPodSandbox(self, request: v1.ListPodSandboxRequest, timeout: float | None = None) -> v1.ListPodSandboxResponse:
        self.listings += 1
        return v1.ListPodSandboxResponse()

    async def ListContainers(self, request: v1.ListContainersRequest, timeout: float | None = None) -> v1.ListContainersResponse:
        return v1.ListContainersResponse()


class StubClient(RuntimeClient):
    """A real RuntimeClient (closed by the release step, as in production) answered by ``stub``."""

    def __init__(self, stub: EmptyStub) -> None:
        super().__init__("/fake/runtime.sock")
        self.stub = stub

    def _new_stub(self, channel: Any) -> Any:
        return self.stub


def make_hook(sock_dir: Path) -> tuple[BalloonsHook, EmptyStub]:
    stub = EmptyStub()
    config = parse_config({**ALONE, "stateDir": str(sock_dir / "state")})
    return BalloonsHook(str(sock_dir / "b.sock"), config, topology=Topology.synthetic(1, 2, 4, 1),
                        runtime=StubClient(stub)), stub


@contextlib.asynccontextmanager
async def serving(hook: BalloonsHook) -> AsyncIterator[None]:
    """The hook started again, its background work run as ``hook run`` runs it, stopped at the end."""
    await asyncio.wait_for(hook.start(), WAIT)
    background = asyncio.create_task(hook.background())
    try:
        yield
    finally:
        await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
        background.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await background


async def assert_serves(hook: BalloonsHook, stub: EmptyStub, state: Path) -> None:
    """Rebuilt from the runtime, a PreCreateContainer answered with its
    balloon's CPUs, the reserved set written, the status socket answering."""
    async with serving(hook):
        await asyncio.wait_for(hook._ready.wait(), WAIT)  # the rebuild listed the runtime: its client is open
        assert stub.listings >= 1
        async with grpc.aio.insecure_channel(hook.target) as channel:
            answer = await api_pb2_grpc.RuntimeHookServiceStub(channel).PreCreateContainerHook(
                request("a", "app"), timeout=WAIT)
        assert answer.container_resources.cpuset_cpus  # placed in a balloon
        await written(hook)  # the writer writes again
        assert saved_in(state)["reserved_cpus"] == hook.status()["reserved_cpus"]  # in the stateDir
        assert (await read_status(hook.status_socket))["ready"] is True


async def test_a_start_refused_its_status_socket_starts_again_once_the_holder_lets_go(sock_dir: Path) -> None:
    """Its hook socket's lock claimed and its listener up, the start is
    refused the status socket (another instance holds its lock and serves
    it): the start stops the hook, its release step closing the runtime
    client and the writer. Once that instance lets go, a start again on the
    same object serves."""
    hook, stub = make_hook(sock_dir)
    status = hook.status_socket
    held = await asyncio.wait_for(socketlock.claim(status, wait_s=0), WAIT)
    with another_instance_serving(status, held):
        with pytest.raises(HookServerError, match="in use"):
            await asyncio.wait_for(hook.start(), WAIT)
        assert not hook.serving and not Path(hook.socket_path).exists()
        assert hook._runtime.closed  # the release step ran: nothing moves while another may hold the lock
        assert not socketlock.lock_path(Path(hook.socket_path)).exists()  # the hook socket's lock let go
    await assert_serves(hook, stub, sock_dir / "state")


async def test_a_start_failing_at_its_listener_starts_again_once_the_cause_is_gone(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its lock claimed, the start fails at its listener (chmod refused):
    the release step runs (runtime client closed, under the lock); with
    chmod working again, a start again on the same object serves."""
    hook, stub = make_hook(sock_dir)
    socket_mode_fails(monkeypatch, hook.socket_path)
    with pytest.raises(HookServerError, match="cannot set the mode"):
        await asyncio.wait_for(hook.start(), WAIT)
    assert hook._runtime.closed and not hook.serving and not Path(hook.socket_path).exists()
    monkeypatch.undo()
    await assert_serves(hook, stub, sock_dir / "state")


async def test_a_hook_that_served_and_was_stopped_is_still_used_once(sock_dir: Path) -> None:
    """Guards existing behaviour, past a failed start: the start again served,
    so its stop used it up."""
    hook, stub = make_hook(sock_dir)
    hook.status_socket.write_text("not a socket")  # the status server refuses a non-socket file
    with pytest.raises(HookServerError, match="is not a unix socket"):
        await asyncio.wait_for(hook.start(), WAIT)
    hook.status_socket.unlink()
    await assert_serves(hook, stub, sock_dir / "state")
    with pytest.raises(HookServerError, match="used once: it served and was stopped"):
        await hook.start()
    assert not hook.serving


async def test_a_start_again_refused_its_hook_socket_leaves_closed_what_the_failed_start_closed(sock_dir: Path) -> None:
    """Guards existing behaviour: what a failed start's release step closed
    reopens only under the hook socket's lock (_before_serving). Another
    instance holding it, the start again is refused "in use" with the runtime
    client closed and the writer ended (no move nor write of this instance
    lands beside the other's); once it lets go, the start serves."""
    hook, stub = make_hook(sock_dir)
    hook.status_socket.write_text("not a socket")  # the status server refuses a non-socket file
    with pytest.raises(HookServerError, match="is not a unix socket"):
        await asyncio.wait_for(hook.start(), WAIT)
    hook.status_socket.unlink()
    path = Path(hook.socket_path)
    held = await asyncio.wait_for(socketlock.claim(path, wait_s=0), WAIT)
    with another_instance_serving(path, held):
        with pytest.raises(HookServerError, match="in use"):
            await asyncio.wait_for(hook.start(), WAIT)
        assert not hook.serving and hook._runtime.closed and hook._saved._finished
    await assert_serves(hook, stub, sock_dir / "state")


async def test_two_concurrent_starts_share_one_outcome_and_the_hook_serves(sock_dir: Path) -> None:
    """Two starts under way share one start, its status socket's included:
    both return, and the hook serves with its status socket and runtime
    client (before: each start its own status step, the second refused the
    status socket's lock by the first and stopping the hook; both raised)."""
    hook, _ = make_hook(sock_dir)
    try:
        outcomes = await asyncio.wait_for(asyncio.gather(hook.start(), hook.start(), return_exceptions=True), WAIT)
        assert outcomes == [None, None]
        assert hook.serving and hook.status_socket.is_socket() and not hook._runtime.closed
        assert (await read_status(hook.status_socket))["ready"] is False  # (no background work run)
    finally:
        await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
    assert not hook.status_socket.exists() and not Path(hook.socket_path).exists()
