"""serve --local-containerd's end, in process: a stop signal is a stop
signal, exit 0, even when containerd's exit comes with it (systemd's
KillMode=control-group signals both on `systemctl stop`); containerd's exit
alone ends serve with its error."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runtimeproxy import app, cli, stopsignal
from runtimeproxy.config import ProxyConfig
from runtimeproxy.host import containerd
from runtimeproxy.host.containerd import LocalRuntimeError


class GoneContainerd:
    """LocalContainerd without a containerd: it exits when the test says so."""

    exited: asyncio.Future[int]

    def __init__(self, base: Path, die_with_parent: bool = False) -> None:
        self.socket = Path(base) / "containerd.sock"
        self.log_path = Path(base) / "containerd.log"
        self.started_pid = 4242

    @property
    def pid(self) -> int | None:  # as LocalContainerd's: None once it exited
        return None if self.exited.done() else self.started_pid

    async def __aenter__(self) -> GoneContainerd:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def wait_exit(self) -> int:
        return await asyncio.shield(self.exited)  # a cancelled wait leaves the process, as a real one's

    def log_tail(self) -> str:
        return "level=fatal msg=gone"


@pytest.fixture
def serving(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """_serve with a fake containerd, a fake proxy and a stop signal the test sets."""
    state = SimpleNamespace(stop=stopsignal.StopSignal(), built=asyncio.Event(), waiting=asyncio.Event(),
                            tasks=SimpleNamespace(failed=asyncio.Event(), error=None))

    state.starting = False  # True: the build waits (for the path's lock, say) until cancelled
    state.cancelled = False
    state.stopping = asyncio.Event()  # the proxy's stop began
    state.stopped = asyncio.Event()  # set: the proxy's stop may end (set unless a test holds it)
    state.stopped.set()

    async def proxy_stop() -> None:
        state.stopping.set()
        await state.stopped.wait()

    async def fake_build(config: ProxyConfig, stack: contextlib.AsyncExitStack, sock: object = None) -> SimpleNamespace:
        state.built.set()
        stack.push_async_callback(proxy_stop)
        if state.starting:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                state.cancelled = True
                raise
        return SimpleNamespace(tasks=state.tasks)

    first = cli._first

    async def waiting_first(*waits: Awaitable[Any]) -> None:
        state.waiting.set()  # serving: in its wait for the first end, from the next loop turn
        await first(*waits)

    monkeypatch.setattr(cli, "_first", waiting_first)
    monkeypatch.setattr(containerd, "LocalContainerd", GoneContainerd)
    monkeypatch.setattr(app, "build_proxy", fake_build)
    monkeypatch.setattr(stopsignal, "stop_on_signals", lambda: state.stop)
    monkeypatch.setattr(cli.gcpolicy, "before_serving", lambda: None)  # no gc.freeze in the test process
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        monkeypatch.delenv(name, raising=False)
    return state


async def _serving(state: SimpleNamespace, tmp_path: Path) -> asyncio.Task[None]:
    GoneContainerd.exited = state.exited = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(cli._serve(ProxyConfig(listen=tmp_path / "p.sock"), tmp_path / "local"))
    # a start that waits is in unless_signalled's wait once the build runs (it runs in that wait)
    await (state.built if state.starting else state.waiting).wait()
    assert not task.done()
    return task


@pytest.mark.parametrize("exit_first", [True, False])
async def test_a_stop_signal_that_comes_with_containerd_s_exit_is_a_signal_stop(
    serving: SimpleNamespace, tmp_path: Path, caplog: pytest.LogCaptureFixture, exit_first: bool,
) -> None:
    """Before: both pending at once, containerd's exit won (exit 1, `the private containerd exited`)."""
    task = await _serving(serving, tmp_path)
    with caplog.at_level(logging.INFO, "runtimeproxy"):
        # in one loop turn, as systemd signals the whole control group
        if exit_first:
            serving.exited.set_result(-15)
        stopsignal._on_stop_signal(serving.stop, signal.SIGTERM)  # as stop_on_signals' handler
        if not exit_first:
            serving.exited.set_result(-15)
        await asyncio.wait_for(task, 5)  # no error: exit 0
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("runtimeproxy")]
    assert ("INFO", "the private containerd exited with the stop signal") in messages
    # once (before, serve logged `signal received, shutting down` after the handler's `stop signal received`)
    assert [m for _, m in messages if "signal received" in m] == ["signal received, shutting down"]
    assert not [m for level, m in messages if level == "ERROR"]


async def test_containerd_s_exit_after_the_stop_signal_during_the_proxy_s_stop_is_logged_as_with_it(
    serving: SimpleNamespace, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """`systemctl stop`'s usual order: the proxy handles the signal first,
    containerd exits a little later. Before: the line the docs promise was
    not written (the wait that ended on the signal cancelled the watch)."""
    serving.stopped.clear()
    task = await _serving(serving, tmp_path)
    with caplog.at_level(logging.INFO, "runtimeproxy"):
        stopsignal._on_stop_signal(serving.stop, signal.SIGTERM)
        await asyncio.wait_for(serving.stopping.wait(), 5)
        serving.exited.set_result(-15)
        await asyncio.sleep(0)
        serving.stopped.set()
        await asyncio.wait_for(task, 5)  # no error: exit 0
    assert [(r.levelname, r.getMessage(), getattr(r, "status", None)) for r in caplog.records
            if r.name == "runtimeproxy" and "private containerd" in r.getMessage()] == [
        ("INFO", "the private containerd exited with the stop signal", "killed by SIGTERM")]


async def test_containerd_s_exit_alone_ends_serve_with_its_error(
    serving: SimpleNamespace, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    task = await _serving(serving, tmp_path)
    with caplog.at_level(logging.INFO, "runtimeproxy"):
        serving.exited.set_result(-9)
        with pytest.raises(LocalRuntimeError, match=r"pid 4242\) exited: killed by SIGKILL; it is not restarted"):
            await asyncio.wait_for(task, 5)
    assert ("ERROR", "shutting down: the private containerd exited") in [
        (r.levelname, r.getMessage()) for r in caplog.records if r.name == "runtimeproxy"]


async def test_first_raises_the_error_of_the_wait_that_ended_it() -> None:
    """Before: the error was never read: serve ended as if stopped (exit 0),
    asyncio logging `Task exception was never retrieved`."""
    async def watcher() -> None:
        raise RuntimeError("injected: the watcher failed")

    pending = asyncio.Event()
    with pytest.raises(RuntimeError, match="injected"):
        await cli._first(pending.wait(), watcher())


async def test_first_returns_when_one_wait_is_done_and_cancels_the_others() -> None:
    done, pending = asyncio.Event(), asyncio.Event()
    done.set()
    other = asyncio.ensure_future(pending.wait())
    await cli._first(done.wait(), other)
    await asyncio.sleep(0)
    assert other.cancelled()


async def test_containerd_s_exit_while_the_proxy_starts_ends_the_start_and_serve_with_its_error(
    serving: SimpleNamespace, tmp_path: Path,
) -> None:
    """Before: noticed only once serving, after a start that may wait up to 600 s for the path's lock."""
    serving.starting = True
    task = await _serving(serving, tmp_path)
    serving.exited.set_result(1)
    with pytest.raises(LocalRuntimeError, match=r"pid 4242\) exited: exit code 1; it is not restarted"):
        await asyncio.wait_for(task, 5)
    assert serving.cancelled  # the start undid its steps


async def test_a_stop_signal_while_the_proxy_starts_still_ends_it_with_exit_0(
    serving: SimpleNamespace, tmp_path: Path,
) -> None:
    serving.starting = True
    task = await _serving(serving, tmp_path)
    serving.stop.received = "SIGTERM"
    serving.stop.set()
    await asyncio.wait_for(task, 5)
    assert serving.cancelled


async def test_containerd_s_exit_before_serve_took_its_pid_names_the_pid_it_started_with(
    serving: SimpleNamespace, tmp_path: Path,
) -> None:
    """Before: `the private containerd (pid None) exited`."""
    GoneContainerd.exited = asyncio.get_running_loop().create_future()
    GoneContainerd.exited.set_result(1)  # between its start and serve's look at it
    with pytest.raises(LocalRuntimeError, match=r"pid 4242\) exited: exit code 1; it is not restarted"):
        await asyncio.wait_for(cli._serve(ProxyConfig(listen=tmp_path / "p.sock"), tmp_path / "local"), 5)
