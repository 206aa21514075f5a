"""Tests of runtimeproxy.hookpath.registry: which files of a hook directory it loads,
and which it refuses (invalid, unsafe permissions, an unsafe directory) while the others load.

Real files in tmp_path.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.registry import HookRegistry, HookSnapshot

from ...prerequisites import fail_or_skip
from . import registrydir
from .registrydir import LOGGER, valid_doc, write
from .test_hookfile import INVALID_CASES, KOORDINATOR_DOC

hook_dir = registrydir.hook_dir  # the fixture, here for pytest to find


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
