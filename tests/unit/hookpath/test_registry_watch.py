"""Tests of runtimeproxy.hookpath.registry: its watcher, which reloads the hook directory
as it changes.

Real files in tmp_path, the real watchfiles watcher; no sleeps where an event can
be awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.registry import HookRegistry, HookSnapshot

from tests.loghandling import handled
from . import registrydir
from .registrydir import LOGGER, valid_doc, write

hook_dir = registrydir.hook_dir  # the fixture, here for pytest to find


class Observer:
    """Collects registry snapshots and hook-config log events, and lets tests await them."""

    def __init__(self, registry: HookRegistry) -> None:
        self.registry = registry
        self._cond = asyncio.Condition()
        self.events: list[tuple[str, str]] = []  # (hook_event, hook_file) from the log
        registry.on_change(self._on_change)
        self._logs = contextlib.ExitStack()
        self._logs.enter_context(handled(LOGGER, logging.DEBUG, self._on_record))

    def close(self) -> None:
        self._logs.close()

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

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Await predicate() becoming true."""
        async with asyncio.timeout(timeout):
            async with self._cond:
                await self._cond.wait_for(predicate)


def endpoint_of(registry: HookRegistry, name: str) -> str | None:
    cfg = registry.snapshot.servers.get(name)
    return cfg.endpoint if cfg else None


@pytest.fixture
async def watched(hook_dir: Path) -> AsyncIterator[tuple[HookRegistry, Observer]]:
    """A registry watching hook_dir, with the watcher proven live by a probe file.

    Its periodic rescan is an hour away: what a test sees within its waits
    (10 s) a watch event brought (before: each wait was bounded at 1 s to
    tell it from the 2 s rescan, which a loaded machine could exceed)."""
    logging.getLogger(LOGGER).setLevel(logging.DEBUG)
    registry = HookRegistry(hook_dir, resync_interval=3600)
    observer = Observer(registry)
    stop = asyncio.Event()

    def probe(attempt: int) -> Callable[[], bool]:
        write(hook_dir, "zz-probe.json", valid_doc(f"/run/probe{attempt}.sock"))
        return lambda: endpoint_of(registry, "zz-probe.json") == f"/run/probe{attempt}.sock"

    seen = probe(0)
    task = asyncio.create_task(registry.watch(stop))
    await observer.wait_for(seen)  # by the watch's first rescan (or an event): rewrites now only an event shows
    # Warm-up: a change before the inotify watch is registered is missed (the
    # periodic rescan is far off): the probe rewritten until the watch sees it.
    async with asyncio.timeout(30):
        for attempt in itertools.count(1):
            with contextlib.suppress(TimeoutError):
                await observer.wait_for(probe(attempt), timeout=1)
                break
    (hook_dir / "zz-probe.json").unlink()
    await observer.wait_for(lambda: "zz-probe.json" not in registry.snapshot.servers)
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
    await observer.wait_for(lambda: endpoint_of(registry, "live.json") == "/run/v1.sock")

    # Edit in place (not an atomic rename) like an operator with an editor.
    (hook_dir / "live.json").write_text(json.dumps(valid_doc("/run/v2.sock", priority=3)))
    await observer.wait_for(lambda: endpoint_of(registry, "live.json") == "/run/v2.sock")
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER)[0].priority == 3

    (hook_dir / "live.json").unlink()
    await observer.wait_for(lambda: "live.json" not in registry.snapshot.servers)
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER) == ()


async def test_watch_broken_edit_keeps_last_good(hook_dir: Path, watched: tuple[HookRegistry, Observer]) -> None:
    registry, observer = watched
    write(hook_dir, "hook.json", valid_doc("/run/good.sock"))
    await observer.wait_for(lambda: endpoint_of(registry, "hook.json") == "/run/good.sock")

    write(hook_dir, "hook.json", valid_doc("/run/bad.sock", **{"failure-policy": "Sometimes"}))
    await observer.wait_for(lambda: ("rejected", "hook.json") in observer.events)
    assert endpoint_of(registry, "hook.json") == "/run/good.sock"

    write(hook_dir, "hook.json", valid_doc("/run/fixed.sock"))
    await observer.wait_for(lambda: endpoint_of(registry, "hook.json") == "/run/fixed.sock")


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


async def test_watch_can_be_cancelled(hook_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled once inside watchfiles' watcher (its first wait for a
    change begun), the watch ends cancelled. Guards existing behaviour."""
    import watchfiles

    real, entered = watchfiles.awatch, asyncio.Event()

    async def awatch(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        changes = real(*args, **kwargs)
        try:
            entered.set()  # the watch goes on into ``changes`` before the test wakes
            async for batch in changes:
                yield batch
        finally:
            await changes.aclose()

    monkeypatch.setattr(watchfiles, "awatch", awatch)  # (watch_directory imports it when it starts)
    registry = HookRegistry(hook_dir)
    task = asyncio.create_task(registry.watch(asyncio.Event()))
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
