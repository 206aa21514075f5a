"""Issue 11 holes 5 and 7(c): an unsafe hook directory keeps the last good set,
and rescans read only what changed.

Real files in tmp_path, the real watchfiles watcher and real metrics.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from runtimeproxy.hookpath import registry as registry_module
from runtimeproxy.hookpath.hookfile import HookServerConfig
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.registry import HookRegistry, ReloadResult
from runtimeproxy.metrics import Metrics

from .registrydir import configmap_update, configmap_volume, make_hook_dir, valid_doc, write

LOGGER = "runtimeproxy.hookpath.registry"


@pytest.fixture
def hook_dir(tmp_path: Path) -> Path:
    return make_hook_dir(tmp_path)


def gauge(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


def refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.ERROR and "refusing to load any hook" in r.getMessage()]


# --------------------------------------------------------------------------- hole 5


def test_unsafe_directory_keeps_last_good_set_and_shows_in_the_metric(
    hook_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    metrics = Metrics()
    write(hook_dir, "fail.json", valid_doc("/run/fail.sock"))
    registry = HookRegistry(hook_dir, metrics=metrics.hook_config)
    registry.reload()
    good = registry.servers_for(HookType.PRE_CREATE_CONTAINER)
    assert gauge(metrics, "runtime_proxy_hook_dir_refused") == 0

    os.chmod(hook_dir, 0o777)
    write(hook_dir, "fail.json", valid_doc("/run/squatted.sock"))  # an edit made while unsafe
    result = registry.rescan(["fail.json"])
    assert result.directory_unsafe and not result.modified
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER) == good
    assert gauge(metrics, "runtime_proxy_hook_dir_refused") == 1
    assert gauge(metrics, "runtime_proxy_hook_dir_kept") == 1  # not read: the last good set kept
    assert len(refusals(caplog)) == 1

    # A change event is a rescan: logged again. The periodic rescan of an
    # unchanged unsafe directory does not repeat it every few seconds.
    registry.rescan(["other.json"])
    registry.rescan()
    assert len(refusals(caplog)) == 2

    os.chmod(hook_dir, 0o755)
    result = registry.rescan()
    assert result.changed == ("fail.json",) and registry.servers_for(HookType.PRE_CREATE_CONTAINER)[0].endpoint == "/run/squatted.sock"
    assert gauge(metrics, "runtime_proxy_hook_dir_refused") == 0
    assert any("usable again" in r.getMessage() for r in caplog.records)


def test_unsafe_directory_at_start_up_means_no_hooks_an_error_and_the_metric(
    hook_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    write(hook_dir, "fail.json", valid_doc())
    os.chmod(hook_dir, 0o757)
    registry = HookRegistry(hook_dir, metrics=metrics.hook_config)
    result = registry.reload()
    assert result.directory_unsafe and len(registry.snapshot) == 0
    assert gauge(metrics, "runtime_proxy_hook_dir_refused") == 1
    [record] = refusals(caplog)
    assert "writable by others" in record.getMessage() and "no hooks are active" in record.getMessage()


def test_rejected_files_show_in_the_metric(hook_dir: Path) -> None:
    metrics = Metrics()
    registry = HookRegistry(hook_dir, metrics=metrics.hook_config)
    write(hook_dir, "good.json", valid_doc())
    write(hook_dir, "bad.json", "{")
    write(hook_dir, "loose.json", valid_doc("/run/l.sock"), mode=0o666)
    registry.reload()
    assert gauge(metrics, "runtime_proxy_hook_files_rejected") == 2
    (hook_dir / "bad.json").unlink()
    (hook_dir / "loose.json").unlink()
    registry.rescan(["bad.json", "loose.json"])
    assert gauge(metrics, "runtime_proxy_hook_files_rejected") == 0


# --------------------------------------------------------------------------- hole 7(c)


class ParseCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: list[str] = []
        real = registry_module.parse_hook_file

        def parse(path: Path, check_permissions: bool = True) -> HookServerConfig:
            self.names.append(Path(path).name)
            return real(path, check_permissions=check_permissions)

        monkeypatch.setattr(registry_module, "parse_hook_file", parse)


def many_files(hook_dir: Path, bad: int = 40) -> None:
    for i in range(bad):
        write(hook_dir, f"bad-{i:03}.json", {"remote-endpoint": "relative.sock"})
    write(hook_dir, "good.json", valid_doc())


async def test_periodic_safety_rescans_do_not_read_unchanged_files(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """1,000 invalid files cost 6% of a core: every 2 s resync re-read and
    re-parsed them all. Now the watcher's periodic rescans read nothing that
    did not change, and do not log the bad files again."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    many_files(hook_dir)
    counter = ParseCounter(monkeypatch)
    registry = HookRegistry(hook_dir, resync_interval=0.1)
    rescans = 0
    enough = asyncio.Event()
    real_rescan: Callable[..., ReloadResult] = registry._rescan  # type: ignore[attr-defined]

    def counting(*args: object, **kwargs: object) -> ReloadResult:
        nonlocal rescans
        rescans += 1
        if rescans == 6:
            enough.set()
        return real_rescan(*args, **kwargs)

    monkeypatch.setattr(registry, "_rescan", counting)
    stop = asyncio.Event()
    task = asyncio.create_task(registry.watch(stop))
    try:
        await asyncio.wait_for(enough.wait(), 10)  # the start-up scan and five periodic ones
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert len(counter.names) == 41, "the start-up scan reads every file once; the periodic rescans read none"
    rejected = [r for r in caplog.records if getattr(r, "hook_event", None) == "rejected"]
    assert len(rejected) == 40, "each bad file is logged once, not on every rescan"


def test_rescan_reads_what_changed_and_what_the_watcher_named(hook_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    many_files(hook_dir, bad=3)
    registry = HookRegistry(hook_dir)
    registry.reload()
    counter = ParseCounter(monkeypatch)

    assert not registry.rescan().modified and counter.names == []
    write(hook_dir, "good.json", valid_doc("/run/new.sock"))  # new inode
    assert registry.rescan().changed == ("good.json",) and counter.names == ["good.json"]

    counter.names.clear()
    os.chmod(hook_dir / "good.json", 0o666)  # only the mode changes: it is re-checked
    result = registry.rescan()
    assert counter.names == ["good.json"] and "writable by" in result.rejected["good.json"]
    os.chmod(hook_dir / "good.json", 0o644)
    registry.rescan()

    counter.names.clear()
    assert registry.rescan(["bad-001.json"]).rejected.keys() == {"bad-000.json", "bad-001.json", "bad-002.json"}
    assert counter.names == ["bad-001.json"]

    counter.names.clear()
    registry.reload()  # an explicit reload re-reads everything
    assert len(counter.names) == 4


def test_rescan_follows_a_symlink_swap_without_an_event(hook_dir: Path, tmp_path: Path) -> None:
    """A ConfigMap-style update: hook.json -> ..data/hook.json, ..data swapped."""
    configmap_volume(hook_dir, "hook.json")
    registry = HookRegistry(hook_dir)
    assert registry.reload().snapshot.servers["hook.json"].endpoint == "/run/v1.sock"
    configmap_update(hook_dir)
    assert registry.rescan().changed == ("hook.json",)
    assert registry.snapshot.servers["hook.json"].endpoint == "/run/v2.sock"


# ------------------------------------------------------- a directory or file unreadable for a moment


def _failing_for(monkeypatch: pytest.MonkeyPatch, name: str, target: Path, err: int) -> Callable[[], None]:
    """``os.<name>`` on ``target`` fails with ``err`` until the returned function is called."""
    real = getattr(os, name)

    def failing(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if Path(os.fsdecode(path)) == target:
            raise OSError(err, os.strerror(err))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(registry_module.os, name, failing)
    return lambda: monkeypatch.setattr(registry_module.os, name, real)


@pytest.mark.parametrize(("call", "errno_", "shown"), [
    ("scandir", 24, "cannot list hook directory"),  # EMFILE: the proxy is out of descriptors
    ("stat", 5, "cannot stat hook directory"),  # EIO
])
def test_a_directory_unreadable_for_a_moment_keeps_the_last_good_set(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, call: str, errno_: int,
    shown: str,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    write(hook_dir, "fail.json", valid_doc("/run/a.sock"))
    metrics = Metrics()
    registry = HookRegistry(hook_dir, metrics=metrics.hook_config)
    registry.reload()
    kept = registry.servers_for(HookType.PRE_CREATE_CONTAINER)
    seen: list[object] = []
    registry.on_change(seen.append)

    heal = _failing_for(monkeypatch, call, hook_dir, errno_)
    result = registry.rescan()
    assert result.directory_error is not None and shown in result.directory_error
    assert not result.directory_unsafe and not result.modified and result.snapshot is registry.snapshot
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER) == kept and seen == []
    assert gauge(metrics, "runtime_proxy_hook_dir_refused") == 0  # not a refusal: nothing says it is unsafe
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert shown in error.getMessage()
    assert "keeping the last good hook set of 1 server(s) (fail.json)" in error.getMessage()
    assert "until it can be read again" in error.getMessage()

    heal()
    assert not registry.rescan().modified and list(registry.snapshot.servers) == ["fail.json"]


def test_a_file_unreadable_for_a_moment_is_read_again_at_the_next_rescan(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = HookRegistry(hook_dir)
    registry.reload()
    write(hook_dir, "new.json", valid_doc("/run/new.sock"))
    heal = _failing_for(monkeypatch, "open", hook_dir / "new.json", 24)  # EMFILE
    result = registry.rescan()
    assert "cannot open" in result.rejected["new.json"] and len(registry.snapshot) == 0
    heal()
    # Unchanged on disk, so a file read and found bad would be remembered; this one was not read.
    assert registry.rescan().added == ("new.json",)


def test_a_directory_under_a_file_is_not_a_directory_not_unreadable(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file in the directory's path is a broken config, as one in its place
    (test_registry_dir_replaced.py): the last good set stays, named for what it is."""
    write(hook_dir, "fail.json", valid_doc("/run/a.sock"))
    registry = HookRegistry(hook_dir)
    registry.reload()
    _failing_for(monkeypatch, "stat", hook_dir, 20)  # ENOTDIR: a path component became a file
    result = registry.rescan()
    assert result.directory_kept and not result.removed and list(registry.snapshot.servers) == ["fail.json"]
    assert result.directory_error == f"hook directory {hook_dir} is not a directory: a file is in its path"


# ------------------------------------------------------- a directory that cannot be read: logged once


def kept_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]


@pytest.mark.parametrize(("call", "shown"), [("scandir", "cannot list"), ("stat", "cannot stat")])
def test_an_unreadable_directory_is_logged_once_however_many_rescans(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, call: str, shown: str
) -> None:
    """Each change event and reload logged the error again while the directory could not be read."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    write(hook_dir, "fail.json", valid_doc("/run/a.sock"))
    registry = HookRegistry(hook_dir)
    registry.reload()
    heal = _failing_for(monkeypatch, call, hook_dir, 13)  # EACCES
    for result in (registry.rescan(["fail.json"]), registry.rescan(["other.json"]), registry.reload(), registry.rescan()):
        assert result.directory_kept and not result.directory_unsafe and list(result.snapshot.servers) == ["fail.json"]
    (line,) = kept_lines(caplog)
    assert line == (f"{shown} hook directory {hook_dir}: Permission denied; keeping the last good hook set of 1 "
                    "server(s) (fail.json) and loading no change from it until it can be read again")
    heal()
    back = registry.rescan()
    assert back.directory_error is None and not back.directory_kept
    assert f"hook directory {hook_dir} is usable again" in [r.getMessage() for r in caplog.records]


def test_an_unreadable_directory_is_logged_again_when_it_fails_again_after_recovering(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Logged once per problem, not once for ever: the same error after the directory was
    usable again is a new failure, which the operator must see."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    write(hook_dir, "fail.json", valid_doc("/run/a.sock"))
    registry = HookRegistry(hook_dir)
    registry.reload()
    for _ in range(2):
        heal = _failing_for(monkeypatch, "scandir", hook_dir, 13)  # EACCES
        registry.rescan()
        registry.rescan()
        heal()
        assert registry.rescan().directory_error is None
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "hook directory" in r.getMessage()]
    failed = (f"cannot list hook directory {hook_dir}: Permission denied; keeping the last good hook set of 1 server(s) "
              "(fail.json) and loading no change from it until it can be read again")
    assert messages == [failed, f"hook directory {hook_dir} is usable again"] * 2


def test_a_directory_gone_keeps_nothing(tmp_path: Path) -> None:
    """Removed, its path gone: no hooks (a file in its place keeps them: test_registry_dir_replaced.py)."""
    hook_dir = make_hook_dir(tmp_path)
    write(hook_dir, "fail.json", valid_doc("/run/a.sock"))
    registry = HookRegistry(hook_dir)
    registry.reload()
    (hook_dir / "fail.json").unlink()
    hook_dir.rmdir()
    result = registry.rescan()
    assert not result.directory_kept and result.removed == ("fail.json",) and len(registry.snapshot) == 0
