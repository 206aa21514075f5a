"""Clean-ups a cancel must not cut (hooks/sharedrun.py to_end) and the undoing
of a start that went no further than its listener (hooks/listen.py close)."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from pathlib import Path

import pytest

from hooks import listen
from hooks.sharedrun import to_end
from runtimeproxy.host import unixsocket


async def test_a_clean_up_failing_after_its_caller_was_cancelled_is_logged_and_the_cancel_keeps_its_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: the clean-up's failure was never read (asyncio's "Task
    exception was never retrieved" at garbage collection, no log of ours),
    and the caller's cancel was raised anew, its message lost."""
    go = asyncio.Event()

    async def clean_up() -> None:
        await go.wait()
        raise OSError(5, "Input/output error")

    caller = asyncio.create_task(to_end(clean_up(), "undoing the start on /run/x.sock"))
    await asyncio.sleep(0)  # the clean-up is under way
    caller.cancel("a stop")
    await asyncio.sleep(0)
    go.set()
    with caplog.at_level(logging.WARNING, "hooks.sdk"), pytest.raises(asyncio.CancelledError) as raised:
        await caller
    assert raised.value.args == ("a stop",)
    (record,) = [r for r in caplog.records if r.name == "hooks.sdk"]
    assert record.getMessage().startswith("undoing the start on /run/x.sock failed after its caller was cancelled")
    assert record.step == "undoing the start on /run/x.sock" and "Input/output error" in record.error
    caplog.clear()
    with caplog.at_level(logging.ERROR, "asyncio"):
        gc.collect()
    assert "never retrieved" not in caplog.text


async def test_a_listener_whose_stop_fails_still_has_its_socket_file_removed(tmp_path: Path) -> None:
    """Before: listen.close removed the socket file after the listener's
    stop only when that stop returned."""
    path = tmp_path / "h.sock"
    bound = socket.socket(socket.AF_UNIX)
    bound.bind(str(path))
    identity = unixsocket.SocketIdentity.of(path)

    class Failing:
        async def stop(self, grace: float | None) -> None:
            raise RuntimeError("the listener's stop failed")

    try:
        with pytest.raises(RuntimeError, match="stop failed"):
            await listen.close(Failing(), path, identity)  # type: ignore[arg-type]
    finally:
        bound.close()
    assert not path.exists()


async def test_a_grpc_listener_whose_socket_cannot_be_identified_is_stopped(tmp_path: Path, monkeypatch) -> None:
    """SocketIdentity.of failing after add_insecure_port bound the socket:
    the bound grpc server is stopped, as when its start fails (before:
    left bound, its port and completion queue held until collected)."""
    path = tmp_path / "h.sock"
    stopped: list[float | None] = []
    real_server = listen.grpc.aio.server

    def server(*args: object, **kwargs: object) -> object:
        made = real_server(*args, **kwargs)
        real_stop = made.stop

        async def stop(grace: float | None) -> None:
            stopped.append(grace)
            await real_stop(grace)

        made.stop = stop  # type: ignore[method-assign]
        return made

    def unidentifiable(p: object) -> unixsocket.SocketIdentity:
        raise OSError(2, "No such file or directory")

    monkeypatch.setattr(listen.grpc.aio, "server", server)
    monkeypatch.setattr(unixsocket.SocketIdentity, "of", staticmethod(unidentifiable))
    from hooks.sdk import HookServer
    with pytest.raises(OSError, match="No such file"):
        await listen.grpc_aio(HookServer(path, transport="grpc"), path, listen.DEFAULT_OPTIONS)
    assert stopped == [None]
