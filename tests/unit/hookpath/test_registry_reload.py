"""Tests of runtimeproxy.hookpath.registry: a reload of the hook directory, its order of
servers, what it reports and notifies, and the last good version of a file kept over a broken edit.

Real files in tmp_path.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtimeproxy.hookpath import registry as registry_module
from runtimeproxy.hookpath.hookfile import HookServerConfig
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.registry import HookRegistry, HookSnapshot

from . import registrydir
from .registrydir import valid_doc, write

hook_dir = registrydir.hook_dir  # the fixture, here for pytest to find


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
