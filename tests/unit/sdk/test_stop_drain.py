"""HookServer.stop of a server registered under hooks.sdk.run: its hook file
removed first, then a drain (new calls still answered while the proxy
notices), then the listener closed with the calls in flight given the grace.

Before: the file went and the listener closed in one step, so a call the
proxy started before it noticed the file gone was refused (under Fail, the
CRI call), although README's own pattern drains.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest

from cri_api.hookapi import api_pb2, api_pb2_grpc
from hooks import runscope
from hooks import stopping as hooks_stopping
from hooks.sdk import DEFAULT_DRAIN_S, HookServer, HookServerError, write_hook_config
from runtimeproxy.host import socketlock
from tests.hookrequests import container_request


class Held(HookServer):
    """Answers cpu_shares 512, once ``release`` is set."""

    def __init__(self, path: Path, **kwargs: object) -> None:
        super().__init__(path, **kwargs)  # type: ignore[arg-type]
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def pre_create_container(self, request):  # type: ignore[no-untyped-def]
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return api_pb2.ContainerResourceHookResponse(
            container_resources=api_pb2.LinuxContainerResources(cpu_shares=512))


async def _call(target: str) -> api_pb2.ContainerResourceHookResponse | grpc.StatusCode:
    """One PreCreateContainer call on a channel of its own (a new connection: the listener's)."""
    async with grpc.aio.insecure_channel(target) as channel:
        try:
            return await api_pb2_grpc.RuntimeHookServiceStub(channel).PreCreateContainerHook(
                container_request(), timeout=10)
        except grpc.aio.AioRpcError as err:
            return err.code()


async def _gone(path: Path) -> None:
    """Until stop, run as a task, has removed ``path`` (it does so before its first wait)."""
    for _ in range(1000):
        if not path.exists():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{path} still there")


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_a_call_in_flight_is_answered_and_new_ones_too_while_it_drains_its_file_gone(
    sock_dir: Path, tmp_path: Path, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "hooks.sdk")
    with runscope.scope():
        server = Held(sock_dir / "h.sock", transport=transport, drain=3.0)
        await server.start()
        hook_file = write_hook_config(tmp_path, "h", server.socket_path, ["PreCreateContainer"], failure_policy="Fail")
        in_flight = asyncio.ensure_future(_call(server.target))
        await asyncio.wait_for(server.started.wait(), 5)
        stopping = asyncio.ensure_future(server.stop())
        await _gone(hook_file)  # first: the proxy stops calling
        assert not stopping.done()
        server.release.set()
        # A call the proxy started before it noticed: a new connection, still accepted.
        late = await asyncio.wait_for(_call(server.target), 5)
        assert not isinstance(late, grpc.StatusCode), late
        assert late.container_resources.cpu_shares == 512
        answer = await asyncio.wait_for(in_flight, 5)
        assert not isinstance(answer, grpc.StatusCode), answer
        assert answer.container_resources.cpu_shares == 512
        await asyncio.wait_for(stopping, 10)
    assert not Path(server.socket_path).exists()
    (draining,) = [r for r in caplog.records if "draining" in r.getMessage()]
    assert draining.drain_s == 3.0 and draining.socket == server.socket_path
    removed = [i for i, r in enumerate(caplog.records) if "removed: its server is stopping" in r.getMessage()]
    assert removed and removed[0] < caplog.records.index(draining)


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_a_call_past_the_grace_is_cut(sock_dir: Path, tmp_path: Path, transport: str) -> None:
    with runscope.scope():
        server = Held(sock_dir / "h.sock", transport=transport)
        await server.start()
        write_hook_config(tmp_path, "h", server.socket_path, ["PreCreateContainer"])
        in_flight = asyncio.ensure_future(_call(server.target))
        await asyncio.wait_for(server.started.wait(), 5)
        await asyncio.wait_for(server.stop(0.2, drain=0.1), 5)  # never released
    assert server.cancelled.is_set()
    assert await asyncio.wait_for(in_flight, 5) in (
        grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL)


async def test_a_file_the_script_removed_before_stop_drains_too(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """README's example unlinks its registration, then leaves ``async with``:
    a call the proxy started before it noticed is still answered."""
    caplog.set_level(logging.INFO, "hooks.sdk")
    with runscope.scope():
        server = Held(sock_dir / "h.sock", drain=3.0)
        server.release.set()
        await server.start()
        write_hook_config(tmp_path, "h", server.socket_path, ["PreCreateContainer"]).unlink()
        stopping = asyncio.ensure_future(server.stop())  # leaving the async with
        await asyncio.sleep(0)  # stop has begun: it waits in its drain
        late = await asyncio.wait_for(_call(server.target), 5)
        assert not isinstance(late, grpc.StatusCode), late  # before the drain: UNAVAILABLE
        assert late.container_resources.cpu_shares == 512
        assert not stopping.done()
        stopping.cancel()  # no need to wait the drain out (cut short: below)
        with pytest.raises(asyncio.CancelledError):
            await stopping
    assert [r.drain_s for r in caplog.records if "draining" in r.getMessage()] == [3.0]


async def test_a_stop_cancelled_while_it_drains_still_closes_and_frees_the_path(sock_dir: Path, tmp_path: Path) -> None:
    """A caller's timeout around stop: the server is closed all the same, its
    socket and lock removed, so the next server on the path starts at once."""
    path = sock_dir / "h.sock"
    with runscope.scope():
        server = Held(path, drain=30.0)
        await server.start()
        hook_file = write_hook_config(tmp_path, "h", server.socket_path, ["PreCreateContainer"])
        stopping = asyncio.ensure_future(server.stop())
        await _gone(hook_file)  # it drains now
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping
    assert not path.exists() and not socketlock.lock_path(path).exists()
    assert not server.serving
    async with Held(path) as successor:  # no wait on a holder: it starts at once
        successor.release.set()
        answer = await asyncio.wait_for(_call(successor.target), 5)
        assert not isinstance(answer, grpc.StatusCode), answer
    await server.stop()  # a later stop of the first: nothing left to do


async def test_a_second_stop_waits_for_the_first_to_end(sock_dir: Path, tmp_path: Path) -> None:
    """A signal handler's stop drains; main's ``async with`` exit stops again.
    Before: the second returned at once, main returned, and asyncio.run
    cancelled the first stop's drain. A second stop cancelled (its caller's
    timeout) leaves the first going."""
    with runscope.scope():
        server = Held(sock_dir / "h.sock", drain=0.3)
        await server.start()
        hook_file = write_hook_config(tmp_path, "h", server.socket_path, ["PreCreateContainer"])
        first = asyncio.ensure_future(server.stop())  # the signal handler's
        await _gone(hook_file)  # it drains now
        impatient = asyncio.ensure_future(server.stop())
        await asyncio.sleep(0)  # it waits for the first
        impatient.cancel()
        with pytest.raises(asyncio.CancelledError):
            await impatient
        assert not first.done()
        await asyncio.wait_for(server.stop(), 10)  # the async with exit
        assert first.done() and first.result() is None  # ended, not cancelled
    assert not Path(server.socket_path).exists()


async def test_a_server_no_hook_file_of_the_run_names_closes_at_once(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No proxy was told of it by this run (plain asyncio.run, a test's
    server), and its drain is not set: no wait for one."""
    caplog.set_level(logging.INFO, "hooks.sdk")
    server = Held(sock_dir / "h.sock")
    await server.start()
    write_hook_config(tmp_path, "h", server.socket_path, ["PreCreateContainer"])  # outside run: not recorded
    stopping = asyncio.ensure_future(server.stop())
    await asyncio.sleep(0)  # stop has begun
    assert await asyncio.wait_for(_call(server.target), 5) == grpc.StatusCode.UNAVAILABLE
    await asyncio.wait_for(stopping, 5)
    assert not [r for r in caplog.records if "draining" in r.getMessage()]


@pytest.mark.parametrize("where", ["constructor", "stop"])
async def test_a_drain_set_drains_a_server_no_hook_file_of_the_run_names(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    """Plain asyncio.run, or a hook file the operator wrote and removes
    before the stop: the SDK cannot tell a proxy calls it, the script can,
    by setting ``drain`` (before: a drain set was ignored without a hook
    file of ``run``'s, and the call the proxy started before it noticed the
    file gone was refused)."""
    caplog.set_level(logging.INFO, "hooks.sdk")
    server = Held(sock_dir / "h.sock", **({"drain": 30.0} if where == "constructor" else {}))
    server.release.set()
    await server.start()
    write_hook_config(tmp_path, "h", server.socket_path, ["PreCreateContainer"]).unlink()  # outside run
    draining_logged = asyncio.Event()

    class Draining(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "draining" in record.getMessage():
                draining_logged.set()

    logging.getLogger("hooks.sdk").addHandler(handler := Draining())
    try:
        stopping = asyncio.ensure_future(server.stop(drain=30.0) if where == "stop" else server.stop())
        await asyncio.wait_for(draining_logged.wait(), 5)  # it waits in its drain
    finally:
        logging.getLogger("hooks.sdk").removeHandler(handler)
    late = await asyncio.wait_for(_call(server.target), 5)
    assert not isinstance(late, grpc.StatusCode), late  # before: UNAVAILABLE
    assert not stopping.done()
    stopping.cancel()  # no need to wait the drain out
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert not server.serving and not Path(server.socket_path).exists()
    (draining,) = [r for r in caplog.records if "draining" in r.getMessage()]
    assert draining.drain_s == 30.0 and draining.hook_file_removed_by_run is False
    assert "as its drain was set" in draining.getMessage()  # not "while the proxy notices its hook file is gone"


async def test_a_stop_given_a_negative_drain_is_refused_before_it_stops_anything(sock_dir: Path) -> None:
    """As the constructor refuses one (before: taken as none), and before the
    stop takes anything: a check later in it would leave the socket and lock."""
    path = sock_dir / "h.sock"
    server = Held(path)
    await server.start()
    with pytest.raises(ValueError, match="drain must be 0 or more"):
        await server.stop(drain=-1)
    assert server.serving
    await server.stop()
    assert not path.exists() and not socketlock.lock_path(path).exists()


def test_the_default_drain_is_hook_runs_and_a_negative_one_is_refused(sock_dir: Path) -> None:
    from hooks.cli import run as hook_run

    (drain,) = [p for p in hook_run.params if p.name == "drain"]
    assert drain.default == DEFAULT_DRAIN_S
    with pytest.raises(ValueError, match="drain must be 0 or more"):
        Held(sock_dir / "h.sock", drain=-1)


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_wait_for_termination_waits_for_the_end_of_a_stop_under_way(
    sock_dir: Path, tmp_path: Path, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A main that waits for termination while a signal handler's stop drains
    returns once the stop has ended, its socket and lock gone. Before: it
    returned at once (``serving`` False) while the server still answered.
    The drain lasts until the checks below are done (before: 0.5 s, which a
    loaded machine could spend before the last check)."""
    draining, drained = asyncio.Event(), asyncio.Event()

    async def drain(seconds: float, registered: bool, socket: str) -> None:
        assert seconds == 0.5
        draining.set()
        await drained.wait()

    monkeypatch.setattr(hooks_stopping, "drain", drain)
    path = sock_dir / "h.sock"
    with runscope.scope():
        server = Held(path, transport=transport, drain=0.5)
        server.release.set()
        await server.start()
        hook_file = write_hook_config(tmp_path, "h", server.socket_path, ["PreCreateContainer"])
        before_stop = asyncio.ensure_future(server.wait_for_termination())  # main's, as README's example
        stopping = asyncio.ensure_future(server.stop())
        await asyncio.wait_for(draining.wait(), 5)
        assert not hook_file.exists()  # removed before the drain
        during_stop = asyncio.ensure_future(server.wait_for_termination())
        assert await server.wait_for_termination(0.05) is True  # the drain outlasts it
        late = await asyncio.wait_for(_call(server.target), 5)  # answered: the stop still drains
        assert not isinstance(late, grpc.StatusCode), late
        assert not before_stop.done() and not during_stop.done() and not stopping.done()
        drained.set()
        for waiter in (before_stop, during_stop):
            assert await asyncio.wait_for(waiter, 10) is False
            assert not path.exists() and not socketlock.lock_path(path).exists()
        await stopping
    assert await server.wait_for_termination() is False  # stopped: at once


async def test_start_while_a_stop_is_under_way_is_refused_and_works_once_it_ends(
    sock_dir: Path, tmp_path: Path
) -> None:
    """Before: start went on to claim the path's lock that the draining stop
    still held: refused as "in use by another process", naming this one's pid."""
    path = sock_dir / "h.sock"
    with runscope.scope():
        server = Held(path, drain=0.3)
        server.release.set()
        await server.start()
        hook_file = write_hook_config(tmp_path, "h", server.socket_path, ["PreCreateContainer"])
        stopping = asyncio.ensure_future(server.stop())
        await _gone(hook_file)  # it drains now
        with pytest.raises(HookServerError, match="still stopping: start it again once its stop has ended"):
            await server.start()
        assert not stopping.done()
        await asyncio.wait_for(stopping, 10)
    await server.start()  # its stop over: serves again on the same path
    try:
        answer = await asyncio.wait_for(_call(server.target), 5)
        assert not isinstance(answer, grpc.StatusCode), answer
    finally:
        await server.stop()


def test_a_subclass_overriding_stop_is_refused_as_it_is_defined() -> None:
    """HookServer.stop checks its arguments before any step: an override
    would stop things first (use _before_stop/_after_stop)."""
    with pytest.raises(TypeError, match="override _before_stop or _after_stop"):
        class Own(HookServer):  # refused as it is defined
            async def stop(self, grace: float | None = None, *, drain: float | None = None) -> None:
                await super().stop(grace, drain=drain)


def test_a_mixin_overriding_stop_is_refused_as_it_is_defined() -> None:
    """A stop a mixin defines, listed before HookServer, overrides it as
    well (before: only a stop in the class's own body was refused)."""
    class Closing:
        async def stop(self, grace: float | None = None, *, drain: float | None = None) -> None:
            await super().stop(grace, drain=drain)  # type: ignore[misc]

    with pytest.raises(TypeError, match="override _before_stop or _after_stop"):
        class Own(Closing, HookServer):  # refused as it is defined
            pass
