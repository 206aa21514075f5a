"""The hook directory's periodic safety rescan, on a timer of the loop's own
(runtimeproxy/hookpath/dirwatch.py): made at each interval while the watched
directory is there, and the watcher stopped (to be set up again) once it was replaced.

Real directories in tmp_path; no sleeps where an event can be awaited.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import watchfiles

from runtimeproxy.hookpath import dirwatch
from runtimeproxy.hookpath.dirwatch import WatchSettings, watch_directory

from . import registrydir
from .registrydir import LOGGER

hook_dir = registrydir.hook_dir


def _swap(directory: Path) -> None:
    """``directory`` replaced by another one, in one rename (as a ConfigMap's volume is)."""
    fresh = directory.with_name(directory.name + ".new")
    fresh.mkdir(mode=0o755)
    directory.rename(directory.with_name(directory.name + ".old"))
    fresh.rename(directory)


async def _watched_through_a_swap(hook_dir: Path, resync_interval: float) -> list[frozenset[str] | None]:
    """``hook_dir`` watched; replaced once the watch is set up (at its first
    rescan of changes only: the timer's), and watched on until the full rescan
    a new watch starts with. The rescans asked for, in order."""
    rescans: list[frozenset[str] | None] = []
    watched_again = asyncio.Event()
    swapped = False

    def rescan(names: frozenset[str] | None) -> None:
        nonlocal swapped
        rescans.append(names)
        if names is None and swapped:
            watched_again.set()
        elif names == frozenset() and not swapped:
            swapped = True
            _swap(hook_dir)

    stop = asyncio.Event()
    task = asyncio.create_task(watch_directory(hook_dir, rescan, WatchSettings(resync_interval=resync_interval), stop))
    try:
        async with asyncio.timeout(10):
            await watched_again.wait()
    finally:
        stop.set()
        async with asyncio.timeout(5):
            await task
    return rescans


async def test_rescans_come_at_each_interval_until_the_directory_is_replaced(hook_dir: Path) -> None:
    identity = dirwatch._directory_identity(hook_dir)
    assert identity is not None
    rescans: list[frozenset[str] | None] = []

    def rescan(names: frozenset[str] | None) -> None:
        rescans.append(names)
        if len(rescans) == 3:
            _swap(hook_dir)

    watcher_stop = dirwatch.ThreadStop()
    task = asyncio.create_task(dirwatch._resync(hook_dir, identity, rescan, 0.01, watcher_stop))
    async with asyncio.timeout(5):
        await task  # it returns once the directory is another
    assert watcher_stop.is_set()  # the watcher is told to stop
    assert rescans == [frozenset()] * 3  # the periodic rescan: re-reads only what changed


async def test_a_rescan_that_fails_is_logged_and_the_next_ones_still_come(
    hook_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    identity = dirwatch._directory_identity(hook_dir)
    assert identity is not None
    rescans = 0
    enough = asyncio.Event()

    def rescan(names: frozenset[str] | None) -> None:
        nonlocal rescans
        rescans += 1
        if rescans == 3:
            enough.set()
        if rescans == 1:
            raise OSError(24, "Too many open files")

    task = asyncio.create_task(dirwatch._resync(hook_dir, identity, rescan, 0.01, dirwatch.ThreadStop()))
    try:
        async with asyncio.timeout(5):
            await enough.wait()
    finally:
        task.cancel()
    assert any("periodic rescan of" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_a_replaced_directory_is_watched_again_and_read_in_full(hook_dir: Path) -> None:
    rescans = await _watched_through_a_swap(hook_dir, resync_interval=0.05)
    assert rescans[0] is None and rescans.count(None) >= 2  # at the start, and for the new directory


async def test_a_replacement_seen_by_the_timer_and_an_event_is_logged_once(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The timer finds the directory replaced and stops the watcher, which
    still yields the batch it had gathered (the swap's events): both saw it."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    watches: list[dict[str, object]] = []

    async def awatch(*paths: object, stop_event: asyncio.Event, **kwargs: object):  # type: ignore[no-untyped-def]
        watches.append(kwargs)
        await stop_event.wait()
        yield {(1, str(hook_dir / "a.json"))}  # gathered before its thread saw the stop

    monkeypatch.setattr(watchfiles, "awatch", awatch)  # (watch_directory imports it when it starts)
    await _watched_through_a_swap(hook_dir, resync_interval=0.01)
    assert [r.getMessage() for r in caplog.records].count(
        f"hook directory {hook_dir} was removed or replaced; re-watching"
    ) == 1
    # The watcher's thread returns now and then with nothing to yield: anyio's
    # threads are no daemons, and one waiting for ever would hold the exit.
    assert all(w["rust_timeout"] == dirwatch.WATCH_THREAD_TIMEOUT_MS > 0 and w["yield_on_timeout"] is False
               for w in watches) and len(watches) == 2
