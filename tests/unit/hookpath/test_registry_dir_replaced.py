"""A hook directory replaced by a file (or a file put in its path) is a broken
hook config: the last good hook set stays in force, as for a broken hook file
or an unreadable directory, until it is a directory again, or is removed
(its path gone: no hooks). It dropped every hook before, letting calls pass
their Fail hooks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from pathlib import Path

import pytest

from runtimeproxy.hookpath.registry import HookRegistry
from tests.loghandling import handled

from . import registrydir
from .registrydir import LOGGER, valid_doc, write
from .test_registry_watch import Observer

hook_dir = registrydir.hook_dir  # the fixture, here for pytest to find


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]


def test_a_directory_replaced_by_a_file_keeps_the_last_good_hooks_until_removed(
    hook_dir: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    write(hook_dir, "fail.json", valid_doc("/run/a.sock"))
    registry = HookRegistry(hook_dir)
    registry.reload()
    kept = registry.snapshot
    shutil.rmtree(hook_dir)
    hook_dir.write_text("{}")  # a hook file's content, written where the directory was

    result = registry.reload()
    assert result.directory_kept and not result.modified and registry.snapshot is kept
    assert result.directory_error == f"hook directory {hook_dir} is not a directory"
    assert errors(caplog) == [
        f"hook directory {hook_dir} is not a directory; keeping the last good hook set of 1 server(s) (fail.json) "
        "and loading no change from it until it is a directory again (or is removed)"
    ]
    registry.rescan()
    assert len(errors(caplog)) == 1  # once per problem

    hook_dir.unlink()  # the path gone: a removal
    result = registry.reload()
    assert result.removed == ("fail.json",) and not result.directory_kept and len(registry.snapshot) == 0


def test_a_file_in_the_directorys_path_keeps_the_last_good_hooks(tmp_path: Path) -> None:
    parent = tmp_path / "runtime"
    hooks = parent / "hookserver.d"
    hooks.mkdir(parents=True)
    write(hooks, "fail.json", valid_doc("/run/a.sock"))
    registry = HookRegistry(hooks)
    registry.reload()
    shutil.rmtree(parent)
    parent.write_text("")
    result = registry.reload()
    assert result.directory_kept and list(registry.snapshot.servers) == ["fail.json"]
    assert result.directory_error == f"hook directory {hooks} is not a directory: a file is in its path"


def test_a_file_in_the_directorys_place_at_start_means_no_hooks(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    result = HookRegistry(tmp_path / "file").reload()
    assert result.directory_kept and len(result.snapshot) == 0


async def test_the_watcher_rescans_when_a_file_in_the_directorys_place_is_removed(
    hook_dir: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """While no directory is there the watcher only polled for one to appear:
    the file removed (the path gone) was never rescanned, and its hooks stayed."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    write(hook_dir, "fail.json", valid_doc("/run/a.sock"))
    registry = HookRegistry(hook_dir, dir_poll_interval=0.05)
    observer = Observer(registry)
    kept = asyncio.Event()
    logs = contextlib.ExitStack()
    logs.enter_context(handled(
        LOGGER, logging.INFO, lambda record: kept.set() if "is not a directory" in record.getMessage() else None))
    stop = asyncio.Event()
    task = asyncio.create_task(registry.watch(stop))
    try:
        await observer.wait_for(lambda: "fail.json" in registry.snapshot.servers)
        shutil.rmtree(hook_dir)
        hook_dir.write_text("")
        await asyncio.wait_for(kept.wait(), 5)
        assert list(registry.snapshot.servers) == ["fail.json"]
        hook_dir.unlink()
        await observer.wait_for(lambda: ("removed", "fail.json") in observer.events)
        assert len(registry.snapshot) == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        observer.close()
        logs.close()


def test_check_config_finds_a_file_in_the_directorys_path_an_error(tmp_path: Path) -> None:
    """It was a warning, read as a missing directory (normal before a first hook server registers)."""
    from runtimeproxy.checkfindings import Severity
    from runtimeproxy.checkhooks import check_hook_directory

    (tmp_path / "file").write_text("")
    _, (finding,) = check_hook_directory(tmp_path / "file" / "hookserver.d")
    assert finding.severity is Severity.ERROR and "a file is in its path" in finding.reason
    _, (missing,) = check_hook_directory(tmp_path / "absent" / "hookserver.d")
    assert missing.severity is Severity.WARNING and "does not exist" in missing.reason


async def test_a_file_in_the_directorys_place_removed_just_after_the_watchers_first_rescan_drops_the_hooks(
    hook_dir: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The watcher took what is in the directory's place after its first
    rescan: a file removed between the two was taken as the poll's starting
    point (missing), the poll saw no change, and the hooks stayed for good."""
    caplog.set_level(logging.INFO, logger=LOGGER)  # the removal's line, awaited below
    write(hook_dir, "fail.json", valid_doc("/run/a.sock"))
    registry = HookRegistry(hook_dir, dir_poll_interval=0.05)
    registry.reload()
    shutil.rmtree(hook_dir)
    hook_dir.write_text("")  # a file in its place when the watcher starts
    observer = Observer(registry)
    reload = registry._safe_reload
    rescans: list[frozenset[str] | None] = []

    def first_then_remove(reread: frozenset[str] | None) -> object:
        result = reload(reread)
        rescans.append(reread)
        if len(rescans) == 1:
            assert result is not None and result.directory_kept  # the file read: the hooks kept
            hook_dir.unlink()  # removed just after the rescan that read it
        return result

    registry._safe_reload = first_then_remove  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(registry.watch(stop))
    try:
        await observer.wait_for(lambda: ("removed", "fail.json") in observer.events)
        assert len(registry.snapshot) == 0 and len(rescans) == 2
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        observer.close()


def test_a_kept_hook_directory_shows_in_a_gauge_until_it_is_read_or_removed(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not a directory, or unreadable, the directory kept its hooks with no
    metric to alert on (runtime_proxy_hook_dir_refused is for unsafe only)."""
    from runtimeproxy.metrics import Metrics

    from .test_registry_rescan import _failing_for

    metrics = Metrics()

    def kept() -> tuple[float | None, float | None]:  # (kept, refused as unsafe)
        value = metrics.registry.get_sample_value
        return value("runtime_proxy_hook_dir_kept"), value("runtime_proxy_hook_dir_refused")

    write(hook_dir, "fail.json", valid_doc("/run/a.sock"))
    registry = HookRegistry(hook_dir, metrics=metrics.hook_config)
    registry.reload()
    assert kept() == (0, 0)
    heal = _failing_for(monkeypatch, "scandir", hook_dir, 24)  # EMFILE: unreadable for now
    assert registry.rescan().directory_kept and kept() == (1, 0)
    heal()
    assert not registry.rescan().directory_kept and kept() == (0, 0)
    shutil.rmtree(hook_dir)
    hook_dir.write_text("")  # a file in its place
    assert registry.reload().directory_kept and kept() == (1, 0)
    hook_dir.unlink()  # removed: no hooks, nothing kept
    assert registry.reload().removed == ("fail.json",) and kept() == (0, 0)
