"""A HookServer start that fails or is cut once its listener is bound undoes
all it made: the listener stopped, the socket file it bound removed, the
socket's lock let go (hooks/sdk.py, hooks/listen.py close, hooks/sharedrun.py).

Before: a socket whose mode could not be set left the frames transport's
socket file behind (its stop leaves the file to its owner); a stop arriving
while that clean-up stopped the listener cut it (a frames listener never
closed, a grpc server left running, the lock let go all the same); and a
second stop during a start cancelled the start again, the second cancel
cutting grpc's stop in the start's own clean-up. Each stop waited on here is
ordered by the loop's FIFO: the stop's first step (its cancel of the start)
is queued before the ``call_soon`` that lets the clean-up go on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from grpc.aio._server import Server as GrpcServer

from hooks.frameserver import FrameServer
from hooks.sdk import HookServer, HookServerError

from ...grpcstarts import cancelling_as_grpc_starts
from .test_lock_release import assert_path_free

WAIT = 10.0  # at most, for what must happen: a failure, not a hang
LISTENERS: dict[str, type[Any]] = {"frames": FrameServer, "grpc": GrpcServer}


class Listeners:
    """The listeners a start made, and a hold on the first stop of one: it
    waits for ``go`` once ``entered`` is set (a stop arriving then finds the
    start in its clean-up)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, transport: str) -> None:
        self.made: list[Any] = []
        self.entered, self.go = asyncio.Event(), asyncio.Event()
        cls = LISTENERS[transport]
        real_init, real_stop = cls.__init__, cls.stop
        held = self

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            real_init(self, *args, **kwargs)
            held.made.append(self)

        async def stop(self: Any, grace: float | None) -> None:
            if not held.entered.is_set():
                held.entered.set()
                await held.go.wait()
            await real_stop(self, grace)

        monkeypatch.setattr(cls, "__init__", init)
        monkeypatch.setattr(cls, "stop", stop)

    def go_after(self, step: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """``step`` as a task, and ``go`` set once its first step has run."""
        task = asyncio.ensure_future(step)
        asyncio.get_running_loop().call_soon(self.go.set)
        return task

    async def assert_stopped(self) -> None:
        (listener,) = self.made
        assert await listener.wait_for_termination(0) is False  # stopped, not left serving


def chmod_refused(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    real = os.chmod

    def chmod(where: Any, mode: int, **kwargs: Any) -> None:
        if Path(where) == path:
            raise PermissionError(1, "Operation not permitted", str(where))
        real(where, mode, **kwargs)

    monkeypatch.setattr(os, "chmod", chmod)


@pytest.mark.parametrize("transport", LISTENERS)
async def test_a_start_whose_socket_mode_cannot_be_set_leaves_nothing_behind(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    """The frames socket file stayed (a stale socket the next start removes,
    but one a start that failed had made); grpc's stop unlinks its own. The
    failure is a HookServerError naming the path and mode (before: a raw
    PermissionError)."""
    path = sock_dir / "h.sock"
    chmod_refused(monkeypatch, path)
    listeners = Listeners(monkeypatch, transport)
    listeners.go.set()
    with pytest.raises(HookServerError, match=f"cannot set the mode of {path} to 0o660: Operation not permitted"):
        await asyncio.wait_for(HookServer(path, transport=transport).start(), WAIT)
    await listeners.assert_stopped()
    await assert_path_free(path)


@pytest.mark.parametrize("stops", [1, 2])
@pytest.mark.parametrize("transport", LISTENERS)
async def test_a_stop_during_a_failed_starts_clean_up_does_not_cut_it(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch, transport: str, stops: int
) -> None:
    """A stop arriving while the failed start stops its listener waits for
    that clean-up, which it does not cut. stops=2 only guards: the clean-up
    runs under to_end, which alone keeps it whole through a second cancel
    (it passes with a SharedRun that cancels the start at every stop);
    SharedRun's cancel-once is checked by the grpc test below."""
    path = sock_dir / "h.sock"
    chmod_refused(monkeypatch, path)
    listeners = Listeners(monkeypatch, transport)
    server = HookServer(path, transport=transport)
    starting = asyncio.ensure_future(server.start())
    await asyncio.wait_for(listeners.entered.wait(), WAIT)  # the start stops its listener
    stopping = [asyncio.ensure_future(server.stop()) for _ in range(stops - 1)]
    stopping.append(listeners.go_after(server.stop()))
    await asyncio.wait_for(asyncio.gather(*stopping), WAIT)
    with pytest.raises(HookServerError, match="was cancelled by a stop"):
        await asyncio.wait_for(starting, WAIT)
    await listeners.assert_stopped()
    await assert_path_free(path)
    assert not server.serving


async def test_a_second_stop_during_a_start_cut_as_grpc_starts_does_not_cut_grpcs_stop(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first stop cancels the start as grpc starts; grpc's start ends, and
    the start stops grpc's server (hooks/grpcstart.py); a second stop then
    cancelled the start again, cutting that stop: grpc's server left running,
    its socket and lock gone (a later shutdown of it unlinks the path by
    name: the next instance's socket)."""
    path = sock_dir / "h.sock"
    listeners = Listeners(monkeypatch, "grpc")
    server = HookServer(path, transport="grpc")
    stops: list[asyncio.Task[None]] = []

    class StopAsGrpcStarts:
        def cancel(self) -> bool:
            stops.append(asyncio.ensure_future(server.stop()))
            return True

    starting = asyncio.ensure_future(server.start())
    with cancelling_as_grpc_starts(StopAsGrpcStarts()) as fired:  # type: ignore[arg-type]
        await asyncio.wait_for(listeners.entered.wait(), WAIT)  # the start's clean-up stops grpc's server
        stops.append(listeners.go_after(server.stop()))
        await asyncio.wait_for(asyncio.gather(*stops), WAIT)
        with pytest.raises(HookServerError, match="was cancelled by a stop"):
            await asyncio.wait_for(starting, WAIT)
    assert fired == [True]
    await listeners.assert_stopped()
    await assert_path_free(path)
