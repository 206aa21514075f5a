"""Tests of runtimeproxy.hookpath.registry: the registry of a hook directory, its watcher and its thread.

Real files in tmp_path, the real watchfiles watcher; no sleeps where an event can
be awaited.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from cri_api.hookapi import api_pb2 as hookapi
from hooks.sdk import HookServer
from runtimeproxy.hookclient.connection import ClientConnection
from runtimeproxy.hookclient.grpcaio import GrpcTransport
from runtimeproxy.hookclient.pool import FramesTransport
from runtimeproxy.hookclient.transport import HookTransport, transport_for
from runtimeproxy.hookpath import registry as registry_module
from runtimeproxy.hookpath.dispatch import Dispatcher
from runtimeproxy.hookpath.hookfile import HookServerConfig
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.registry import HookRegistry, HookSnapshot

from ...prerequisites import fail_or_skip
from .test_hookfile import (
    INVALID_CASES,
    KOORDINATOR_DOC,
    make_hook_dir,
    valid_doc,
    write,
)

LOGGER = "runtimeproxy.hookpath.registry"


@pytest.fixture
def hook_dir(tmp_path: Path) -> Path:
    return make_hook_dir(tmp_path)


def test_registry_rejects_invalid_files_while_others_load(hook_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    for name, (content, _) in INVALID_CASES.items():
        write(hook_dir, name, content)
    write(hook_dir, "good-a.json", valid_doc("/run/a.sock"))
    write(hook_dir, "good-b.json", KOORDINATOR_DOC)

    registry = HookRegistry(hook_dir)
    result = registry.reload()

    assert result.directory_error is None
    assert result.added == ("good-a.json", "good-b.json")
    assert set(registry.snapshot.servers) == {"good-a.json", "good-b.json"}
    assert set(result.rejected) == set(INVALID_CASES)
    for name, (_, reason) in INVALID_CASES.items():
        assert reason in result.rejected[name]
    # One error line per rejected file, naming it and the reason.
    rejected_logs = {r.hook_file: r for r in caplog.records if getattr(r, "hook_event", None) == "rejected"}  # type: ignore[attr-defined]
    assert set(rejected_logs) == set(INVALID_CASES)
    for name, record in rejected_logs.items():
        assert record.levelno == logging.ERROR
        assert name in record.getMessage()
        assert record.reason == result.rejected[name]  # type: ignore[attr-defined]
    loaded_logs = [r for r in caplog.records if getattr(r, "hook_event", None) == "loaded"]
    assert {r.hook_file for r in loaded_logs} == {"good-a.json", "good-b.json"}  # type: ignore[attr-defined]
    koord = next(r for r in loaded_logs if r.hook_file == "good-b.json")  # type: ignore[attr-defined]
    assert koord.hook_endpoint == "/var/run/koordlet/koordlet.sock"  # type: ignore[attr-defined]
    assert "PreCreateContainer" in koord.hook_points  # type: ignore[attr-defined]
    assert "/var/run/koordlet/koordlet.sock" in koord.getMessage()

    # A second reload with nothing changed neither changes anything nor re-logs the rejections.
    caplog.clear()
    again = registry.reload()
    assert not again.modified
    assert again.snapshot is result.snapshot
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]


def test_non_json_hidden_and_directories_ignored(hook_dir: Path) -> None:
    write(hook_dir, "hook.json", valid_doc())
    write(hook_dir, "README", "not a hook")
    write(hook_dir, "hook.json.bak", valid_doc("/run/bak.sock"))
    write(hook_dir, ".hidden.json", valid_doc("/run/hidden.sock"))
    (hook_dir / "sub.json").mkdir()
    write(hook_dir / "sub.json", "nested.json", valid_doc("/run/nested.sock"))
    result = HookRegistry(hook_dir).reload()
    assert list(result.snapshot.servers) == ["hook.json"]
    assert not result.rejected


# --------------------------------------------------------------------------- permission safety


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666, 0o620, 0o602])
def test_group_or_other_writable_file_refused_while_others_load(hook_dir: Path, mode: int) -> None:
    write(hook_dir, "loose.json", valid_doc(), mode=mode)
    write(hook_dir, "tight.json", valid_doc("/run/t.sock"), mode=0o600)
    result = HookRegistry(hook_dir).reload()
    assert list(result.snapshot.servers) == ["tight.json"]
    assert "writable by" in result.rejected["loose.json"]


def test_directory_not_owned_by_root_refused(hook_dir: Path) -> None:
    if os.geteuid() != 0:
        fail_or_skip("needs root to chown (CI runs as root)")
    write(hook_dir, "hook.json", valid_doc())
    os.chown(hook_dir, 12345, 12345)
    result = HookRegistry(hook_dir).reload()
    assert result.directory_error is not None and "owned by uid 12345" in result.directory_error
    assert len(result.snapshot) == 0


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_group_or_other_writable_directory_refused(
    hook_dir: Path, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    write(hook_dir, "hook.json", valid_doc())
    registry = HookRegistry(hook_dir)
    assert list(registry.reload().snapshot.servers) == ["hook.json"]
    seen: list[HookSnapshot] = []
    registry.on_change(seen.append)

    kept = registry.servers_for(HookType.PRE_CREATE_CONTAINER)
    os.chmod(hook_dir, mode)
    write(hook_dir, "evil.json", valid_doc("/run/evil.sock"))  # what a squatter would add meanwhile
    result = registry.reload()
    # Nothing in it is loaded, and the last good hook set stays in force
    # (issue 11: dropping it let pods start without their Fail hooks).
    assert result.directory_error is not None and result.directory_unsafe
    assert "refusing to load any hook" in result.directory_error and "writable by" in result.directory_error
    assert not result.modified and result.snapshot is registry.snapshot
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER) == kept
    assert seen == []
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "refusing to load any hook" in r.getMessage()]
    assert len(errors) == 1 and "keeping the last good hook set of 1 server(s) (hook.json)" in errors[0].getMessage()
    registry.reload()  # logged as an error on each rescan
    assert len([r for r in caplog.records if r.levelno == logging.ERROR and "refusing to load any hook" in r.getMessage()]) == 2

    os.chmod(hook_dir, 0o755)
    assert registry.reload().added == ("evil.json",)


def test_group_writable_directory_refused_from_start(hook_dir: Path) -> None:
    write(hook_dir, "hook.json", valid_doc())
    os.chmod(hook_dir, 0o775)
    result = HookRegistry(hook_dir).reload()
    assert result.directory_error and "writable by group" in result.directory_error
    assert len(result.snapshot) == 0 and not result.modified


def test_dangling_symlink_rejected(hook_dir: Path) -> None:
    (hook_dir / "dangling.json").symlink_to(hook_dir / "nowhere.json")
    result = HookRegistry(hook_dir).reload()
    assert "dangling symlink" in result.rejected["dangling.json"]


# --------------------------------------------------------------------------- registry


def test_ordering_by_priority_then_file_name(hook_dir: Path) -> None:
    write(hook_dir, "b.json", valid_doc("/run/b.sock", priority=10))
    write(hook_dir, "a.json", valid_doc("/run/a.sock", priority=10))
    write(hook_dir, "z.json", valid_doc("/run/z.sock", priority=-5))
    write(hook_dir, "m.json", valid_doc("/run/m.sock"))  # default 0
    write(hook_dir, "c.json", valid_doc("/run/c.sock", **{"runtime-hooks": ["PreStartContainer"]}))
    registry = HookRegistry(hook_dir)
    registry.reload()
    assert [s.name for s in registry.servers_for(HookType.PRE_CREATE_CONTAINER)] == ["z.json", "m.json", "a.json", "b.json"]
    assert [s.name for s in registry.servers_for(HookType.PRE_START_CONTAINER)] == ["c.json"]
    assert registry.servers_for(HookType.POST_STOP_CONTAINER) == ()
    assert isinstance(registry.servers_for(HookType.PRE_CREATE_CONTAINER), tuple)


def test_missing_directory_means_no_hooks(tmp_path: Path) -> None:
    registry = HookRegistry(tmp_path / "absent")
    result = registry.reload()
    assert result.directory_error is not None and "does not exist" in result.directory_error
    assert len(result.snapshot) == 0
    assert registry.servers_for(HookType.PRE_RUN_POD_SANDBOX) == ()


def test_directory_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    result = HookRegistry(tmp_path / "file").reload()
    assert result.directory_error is not None and "not a directory" in result.directory_error


def test_reload_reports_added_changed_removed_and_notifies(hook_dir: Path) -> None:
    registry = HookRegistry(hook_dir)
    seen: list[HookSnapshot] = []
    unsubscribe = registry.on_change(seen.append)

    write(hook_dir, "a.json", valid_doc("/run/a.sock"))
    write(hook_dir, "b.json", valid_doc("/run/b.sock"))
    r1 = registry.reload()
    assert (r1.added, r1.changed, r1.removed) == (("a.json", "b.json"), (), ())
    assert len(seen) == 1 and seen[0] is registry.snapshot
    assert seen[0].endpoints == {"/run/a.sock", "/run/b.sock"}

    # Touching a file without changing its content is not a change.
    os.utime(hook_dir / "a.json")
    assert not registry.reload().modified
    assert len(seen) == 1

    write(hook_dir, "a.json", valid_doc("/run/a2.sock"))
    (hook_dir / "b.json").unlink()
    write(hook_dir, "c.json", valid_doc("/run/c.sock"))
    r2 = registry.reload()
    assert (r2.added, r2.changed, r2.removed) == (("c.json",), ("a.json",), ("b.json",))
    assert len(seen) == 2
    assert seen[1].endpoints == {"/run/a2.sock", "/run/c.sock"}
    # Old snapshots are immutable and unaffected.
    assert seen[0].servers["a.json"].endpoint == "/run/a.sock"
    assert seen[1].generation == seen[0].generation + 1
    with pytest.raises(TypeError):
        seen[1].servers["x"] = seen[1].servers["a.json"]  # type: ignore[index]

    unsubscribe()
    (hook_dir / "c.json").unlink()
    assert registry.reload().removed == ("c.json",)
    assert len(seen) == 2


def test_failing_callback_does_not_break_reload(hook_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    registry = HookRegistry(hook_dir)
    seen: list[HookSnapshot] = []

    def boom(_: HookSnapshot) -> None:
        raise RuntimeError("boom")

    registry.on_change(boom)
    registry.on_change(seen.append)
    write(hook_dir, "a.json", valid_doc())
    assert registry.reload().added == ("a.json",)
    assert len(seen) == 1
    assert any("callback" in r.getMessage() and r.exc_info for r in caplog.records)


def test_broken_edit_keeps_last_good_version(hook_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    registry = HookRegistry(hook_dir)
    write(hook_dir, "hook.json", valid_doc("/run/good.sock"))
    good = registry.reload().snapshot.servers["hook.json"]

    write(hook_dir, "hook.json", '{"remote-endpoint": "/run/good.sock", "runtime-hooks": ["PreCreateContainer"')
    result = registry.reload()
    assert not result.modified
    assert result.kept == ("hook.json",)
    assert "invalid JSON" in result.rejected["hook.json"]
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER) == (good,)
    record = next(r for r in caplog.records if getattr(r, "hook_event", None) == "rejected")
    assert "keeping its last good version" in record.getMessage()
    assert record.hook_kept_last_good is True  # type: ignore[attr-defined]

    # An unsafe edit is treated the same way.
    write(hook_dir, "hook.json", valid_doc("/run/evil.sock"), mode=0o666)
    result = registry.reload()
    assert result.kept == ("hook.json",) and "writable by" in result.rejected["hook.json"]
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER) == (good,)

    # Fixing it takes effect; deleting it removes it.
    write(hook_dir, "hook.json", valid_doc("/run/fixed.sock"))
    assert registry.reload().changed == ("hook.json",)
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER)[0].endpoint == "/run/fixed.sock"
    (hook_dir / "hook.json").unlink()
    assert registry.reload().removed == ("hook.json",)


def test_unexpected_error_on_one_file_keeps_it_and_loads_the_others(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever goes wrong reading one file (here: a bug) is that file's rejection, never the registry's."""
    registry = HookRegistry(hook_dir)
    write(hook_dir, "odd.json", valid_doc("/run/odd.sock"))
    good = registry.reload().snapshot.servers["odd.json"]
    real_parse = registry_module.parse_hook_file

    def parse(path: Path, check_permissions: bool = True) -> HookServerConfig:
        if Path(path).name == "odd.json":
            raise RuntimeError("boom")
        return real_parse(path, check_permissions=check_permissions)

    monkeypatch.setattr(registry_module, "parse_hook_file", parse)
    write(hook_dir, "other.json", valid_doc("/run/other.sock"))
    result = registry.reload()
    assert result.added == ("other.json",)
    assert result.kept == ("odd.json",)
    assert result.rejected["odd.json"] == "cannot be read: RuntimeError: boom"
    assert registry.snapshot.servers["odd.json"] == good
    assert any("boom" in r.getMessage() for r in caplog.records if getattr(r, "hook_event", None) == "rejected")


def test_invalid_file_without_previous_version_is_not_loaded(hook_dir: Path) -> None:
    registry = HookRegistry(hook_dir)
    write(hook_dir, "hook.json", "{")
    result = registry.reload()
    assert result.kept == () and "hook.json" in result.rejected
    assert len(registry.snapshot) == 0


# --------------------------------------------------------------------------- watcher


class Observer:
    """Collects registry snapshots and hook-config log events, and lets tests await them."""

    def __init__(self, registry: HookRegistry) -> None:
        self.registry = registry
        self._cond = asyncio.Condition()
        self.events: list[tuple[str, str]] = []  # (hook_event, hook_file) from the log
        registry.on_change(self._on_change)
        self._handler = _CallbackHandler(self._on_record)
        logging.getLogger(LOGGER).addHandler(self._handler)

    def close(self) -> None:
        logging.getLogger(LOGGER).removeHandler(self._handler)

    def _notify(self) -> None:
        # Callbacks run in the event-loop thread (watch() reloads there).
        async def notify() -> None:
            async with self._cond:
                self._cond.notify_all()

        asyncio.get_running_loop().create_task(notify())

    def _on_change(self, snapshot: HookSnapshot) -> None:
        self._notify()

    def _on_record(self, record: logging.LogRecord) -> None:
        event = getattr(record, "hook_event", None)
        if event:
            self.events.append((event, record.hook_file))  # type: ignore[attr-defined]
            self._notify()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> float:
        """Await predicate() becoming true; returns the time it took."""
        start = time.monotonic()
        async with asyncio.timeout(timeout):
            async with self._cond:
                await self._cond.wait_for(predicate)
        return time.monotonic() - start


class _CallbackHandler(logging.Handler):
    def __init__(self, callback: Callable[[logging.LogRecord], None]) -> None:
        super().__init__(level=logging.DEBUG)
        self._callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        self._callback(record)


def endpoint_of(registry: HookRegistry, name: str) -> str | None:
    cfg = registry.snapshot.servers.get(name)
    return cfg.endpoint if cfg else None


@pytest.fixture
async def watched(hook_dir: Path) -> AsyncIterator[tuple[HookRegistry, Observer]]:
    """A registry watching hook_dir, with the watcher proven live by a probe file."""
    logging.getLogger(LOGGER).setLevel(logging.DEBUG)
    registry = HookRegistry(hook_dir)
    observer = Observer(registry)
    stop = asyncio.Event()
    task = asyncio.create_task(registry.watch(stop))
    # Warm-up: the first change may land before the inotify watch is registered
    # and then only be caught by the periodic resync; wait for it generously.
    write(hook_dir, "zz-probe.json", valid_doc("/run/probe.sock"))
    await observer.wait_for(lambda: "zz-probe.json" in registry.snapshot.servers, timeout=10)
    (hook_dir / "zz-probe.json").unlink()
    await observer.wait_for(lambda: "zz-probe.json" not in registry.snapshot.servers, timeout=10)
    try:
        yield registry, observer
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        observer.close()
        logging.getLogger(LOGGER).setLevel(logging.NOTSET)


async def test_watch_live_add_change_delete(hook_dir: Path, watched: tuple[HookRegistry, Observer]) -> None:
    registry, observer = watched

    write(hook_dir, "live.json", valid_doc("/run/v1.sock"))
    took = await observer.wait_for(lambda: endpoint_of(registry, "live.json") == "/run/v1.sock")
    assert took < 1.0, f"add took {took:.2f}s"

    # Edit in place (not an atomic rename) like an operator with an editor.
    (hook_dir / "live.json").write_text(json.dumps(valid_doc("/run/v2.sock", priority=3)))
    took = await observer.wait_for(lambda: endpoint_of(registry, "live.json") == "/run/v2.sock")
    assert took < 1.0, f"change took {took:.2f}s"
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER)[0].priority == 3

    (hook_dir / "live.json").unlink()
    took = await observer.wait_for(lambda: "live.json" not in registry.snapshot.servers)
    assert took < 1.0, f"delete took {took:.2f}s"
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER) == ()


async def test_watch_broken_edit_keeps_last_good(hook_dir: Path, watched: tuple[HookRegistry, Observer]) -> None:
    registry, observer = watched
    write(hook_dir, "hook.json", valid_doc("/run/good.sock"))
    await observer.wait_for(lambda: endpoint_of(registry, "hook.json") == "/run/good.sock")

    write(hook_dir, "hook.json", valid_doc("/run/bad.sock", **{"failure-policy": "Sometimes"}))
    took = await observer.wait_for(lambda: ("rejected", "hook.json") in observer.events)
    assert took < 1.0
    assert endpoint_of(registry, "hook.json") == "/run/good.sock"

    write(hook_dir, "hook.json", valid_doc("/run/fixed.sock"))
    took = await observer.wait_for(lambda: endpoint_of(registry, "hook.json") == "/run/fixed.sock")
    assert took < 1.0


async def test_watch_waits_for_missing_directory(tmp_path: Path) -> None:
    hook_dir = tmp_path / "later" / "hookserver.d"
    registry = HookRegistry(hook_dir)
    observer = Observer(registry)
    stop = asyncio.Event()
    task = asyncio.create_task(registry.watch(stop))
    try:
        hook_dir.mkdir(parents=True)
        os.chmod(hook_dir, 0o755)
        write(hook_dir, "hook.json", valid_doc())
        await observer.wait_for(lambda: "hook.json" in registry.snapshot.servers)

        # Directory removed and re-created: the watcher follows the new directory.
        (hook_dir / "hook.json").unlink()
        hook_dir.rmdir()
        await observer.wait_for(lambda: len(registry.snapshot) == 0)
        hook_dir.mkdir()
        os.chmod(hook_dir, 0o755)
        write(hook_dir, "again.json", valid_doc("/run/again.sock"))
        await observer.wait_for(lambda: "again.json" in registry.snapshot.servers)
        assert not task.done()
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        observer.close()


async def test_watch_stops_promptly_and_survives_unusable_directory(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    registry = HookRegistry(not_a_dir)
    stop = asyncio.Event()
    task = asyncio.create_task(registry.watch(stop))
    await asyncio.sleep(0)  # let it start; nothing to await on an unusable directory
    assert not task.done()
    stop.set()
    await asyncio.wait_for(task, 2)
    assert task.exception() is None


async def test_watch_can_be_cancelled(hook_dir: Path) -> None:
    registry = HookRegistry(hook_dir)
    task = asyncio.create_task(registry.watch(asyncio.Event()))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)


# --------------------------------------------------------------------------- the registry's thread

POST_HOOK = HookType.POST_STOP_CONTAINER


class Held:
    """The connection (channel) a transport holds to an endpoint now."""

    def __init__(self, transport: HookTransport, endpoint: str) -> None:
        if isinstance(transport, FramesTransport):
            self._conn: ClientConnection | None = transport._connections[endpoint]
        else:
            assert isinstance(transport, GrpcTransport)
            self._conn, self._channel = None, transport._channels[endpoint]

    def is_closed(self) -> bool:
        if self._conn is not None:
            return self._conn.lost.done()
        return self._channel.get_state() is grpc.ChannelConnectivity.SHUTDOWN

    async def wait_closed(self) -> None:
        if self._conn is not None:
            await asyncio.shield(self._conn.lost)
            return
        while (state := self._channel.get_state()) is not grpc.ChannelConnectivity.SHUTDOWN:
            await self._channel.wait_for_state_change(state)


async def call_post(registry: HookRegistry, dispatcher: Dispatcher) -> None:
    """One successful post hook call (``run_post`` would swallow a failure)."""
    (server,) = registry.servers_for(POST_HOOK)
    await dispatcher.call(server, POST_HOOK, hookapi.ContainerResourceHookRequest())


@pytest.fixture(params=["frames", "grpc"])
async def dispatcher_with_open_connection(
    request: pytest.FixtureRequest, hook_dir: Path, tmp_path: Path
) -> AsyncIterator[tuple[HookRegistry, Dispatcher, str]]:
    """A registry with one post hook server and a dispatcher (on each
    transport) that has called it once, so holds a connection to it."""
    endpoint = str(tmp_path / "post-hook.sock")
    write(hook_dir, "post.json", valid_doc(endpoint, **{"runtime-hooks": [POST_HOOK.value]}))
    registry = HookRegistry(hook_dir)
    registry.reload()
    dispatcher = Dispatcher(registry, transport=transport_for(request.param))
    async with HookServer(endpoint):
        await call_post(registry, dispatcher)
        assert dispatcher.transport.endpoints() == {endpoint}
        try:
            yield registry, dispatcher, endpoint
        finally:
            await dispatcher.close()


async def test_reload_that_removes_a_server_closes_its_connection(
    hook_dir: Path, dispatcher_with_open_connection: tuple[HookRegistry, Dispatcher, str]
) -> None:
    registry, dispatcher, endpoint = dispatcher_with_open_connection
    held = Held(dispatcher.transport, endpoint)
    (hook_dir / "post.json").unlink()
    assert registry.reload().removed == ("post.json",)
    assert dispatcher.transport.endpoints() == frozenset()
    await asyncio.wait_for(held.wait_closed(), 5)


async def test_reload_from_another_thread_is_refused_and_changes_nothing(
    hook_dir: Path, dispatcher_with_open_connection: tuple[HookRegistry, Dispatcher, str]
) -> None:
    """A reload elsewhere than on the loop's thread used to run the callbacks there: the
    dispatcher forgot the removed server's channel but could not close it (no loop)."""
    registry, dispatcher, endpoint = dispatcher_with_open_connection
    held = Held(dispatcher.transport, endpoint)
    (hook_dir / "post.json").unlink()
    with pytest.raises(RuntimeError, match=r"HookRegistry\.reload\(\) called from thread .* belongs to thread"):
        await asyncio.to_thread(registry.reload)
    # Nothing happened: the server is still registered (readable from any
    # thread), and the dispatcher still holds and uses its one connection.
    assert [s.name for s in await asyncio.to_thread(registry.servers_for, POST_HOOK)] == ["post.json"]
    await call_post(registry, dispatcher)
    assert dispatcher.transport.endpoints() == {endpoint}
    assert Held(dispatcher.transport, endpoint).__dict__ == held.__dict__  # the same connection
    assert not held.is_closed()


async def test_on_change_and_watch_refuse_another_thread(hook_dir: Path) -> None:
    registry = HookRegistry(hook_dir)
    with pytest.raises(RuntimeError, match=r"HookRegistry\.on_change\(\) called from thread"):
        await asyncio.to_thread(registry.on_change, lambda snapshot: None)
    stopped = asyncio.Event()
    stopped.set()  # were it accepted, watch() would return at once rather than run forever
    with pytest.raises(RuntimeError, match=r"HookRegistry\.watch\(\) called from thread"):
        await asyncio.to_thread(asyncio.run, registry.watch(stopped))
