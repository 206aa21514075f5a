"""The end of a hook file's rejection is logged, one info line naming the
file, why it ended and what is in force now: a rejected file put back to its
last good version, or removed, logged nothing, and the operator had no word
that the error line before no longer held. `status`'s rejected files agree."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from runtimeproxy.hookpath.registry import HookRegistry
from tests.unit.test_admin_status import source

from . import registrydir
from .registrydir import LOGGER, valid_doc, write
from .test_registry_rescan import _failing_for

hook_dir = registrydir.hook_dir  # the fixture, here for pytest to find


def infos(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]


def rejected_then(hook_dir: Path, caplog: pytest.LogCaptureFixture, good: bool = True) -> HookRegistry:
    """a.json loaded (``good``), then broken: rejected, its last good version kept."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    registry = HookRegistry(hook_dir)
    if good:
        write(hook_dir, "a.json", valid_doc("/run/a.sock"))
        registry.reload()
    write(hook_dir, "a.json", "{not json")
    assert "a.json" in registry.reload().rejected
    caplog.clear()
    return registry


def test_a_rejected_file_put_back_to_its_last_good_version_ends_its_rejection(
    hook_dir: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    registry = rejected_then(hook_dir, caplog)
    write(hook_dir, "a.json", valid_doc("/run/a.sock"))
    result = registry.reload()
    assert not result.modified and dict(result.rejected) == {}
    (line,) = infos(caplog)
    assert line.getMessage().startswith(
        "hook config rejection ended: file=a.json restored to its last good version, which stays in force: "
        "endpoint=/run/a.sock hooks=[PreCreateContainer] failure_policy=Fail")
    assert (line.hook_file, line.hook_event, line.hook_rejection_ended) == ("a.json", "restored", "restored")  # type: ignore[attr-defined]
    assert source(registry.last_reload).document()["hook_files_rejected"] == {}
    registry.reload()  # said once
    assert len(infos(caplog)) == 1


def test_a_rejected_file_removed_ends_its_rejection_and_its_last_good_version(
    hook_dir: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    registry = rejected_then(hook_dir, caplog)
    (hook_dir / "a.json").unlink()
    result = registry.reload()
    assert result.removed == ("a.json",) and dict(result.rejected) == {}
    (line,) = infos(caplog)  # one line, not a removal and a rejection's end apart
    assert line.getMessage().startswith(
        "hook config rejection ended: file=a.json removed; its last good version, in force until now, "
        "is removed with it: endpoint=/run/a.sock")
    assert (line.hook_event, line.hook_rejection_ended) == ("removed", "removed")  # type: ignore[attr-defined]


def test_a_file_rejected_from_the_start_and_removed_ends_its_rejection(
    hook_dir: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    registry = rejected_then(hook_dir, caplog, good=False)
    (hook_dir / "a.json").unlink()
    assert not registry.reload().modified
    (line,) = infos(caplog)
    assert line.getMessage() == "hook config rejection ended: file=a.json removed; no version of it was in force, nor is now"
    assert (line.hook_file, line.hook_event, line.hook_rejection_ended) == ("a.json", "removed", "removed")  # type: ignore[attr-defined]


def test_a_rejected_file_fixed_to_new_content_says_its_rejection_ended(
    hook_dir: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    registry = rejected_then(hook_dir, caplog)
    write(hook_dir, "a.json", valid_doc("/run/b.sock"))
    assert registry.reload().changed == ("a.json",)
    (line,) = infos(caplog)
    assert line.getMessage().startswith("hook config changed: file=a.json endpoint=/run/b.sock")
    assert line.getMessage().endswith("; its rejection ended")
    assert line.hook_rejection_ended == "fixed"  # type: ignore[attr-defined]


def test_rejected_files_stay_listed_while_the_directory_cannot_be_read(
    hook_dir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The directory not read, its files' rejections stand as last read: `status` listed none."""
    registry = rejected_then(hook_dir, caplog)
    reason = registry.last_reload.rejected["a.json"]
    heal = _failing_for(monkeypatch, "scandir", hook_dir, 24)  # EMFILE
    result = registry.rescan()
    assert result.directory_kept and dict(result.rejected) == {"a.json": reason}
    assert result.kept == ("a.json",)
    assert list(source(result).document()["hook_files_rejected"]) == ["a.json"]
    heal()
    write(hook_dir, "a.json", valid_doc("/run/a.sock"))
    registry.reload()
    assert [r.getMessage().split(" restored")[0] for r in infos(caplog) if "rejection ended" in r.getMessage()] == [
        "hook config rejection ended: file=a.json"]

