"""``hook run``'s Registration: a hook directory it had to create is warned
about (a mistyped --hook-dir is read by no proxy); an existing one is not; a
registration that cannot be removed is an error line naming it."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from hooks.cli import Registration
from runtimeproxy.hookpath.hookfile import DEFAULT_HOOK_DIR


def _hook(tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(socket_path=str(tmp_path / "noop.sock"), HOOKS=["PreCreateContainer"], PRIORITY=0)


def test_created_hook_dir_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "hookserver.d.typo"
    with caplog.at_level(logging.WARNING, logger="hooks.run"):
        Registration(directory, "noop", "Ignore", None, None).write(_hook(tmp_path))  # type: ignore[arg-type]
    assert (directory / "noop.json").is_file()  # still created and written
    [record] = [r for r in caplog.records if r.name == "hooks.run" and r.levelno == logging.WARNING]
    message = record.getMessage()
    assert str(directory) in message and "hook-dir" in message and str(DEFAULT_HOOK_DIR) in message
    assert record.hook_dir == str(directory)


def test_existing_hook_dir_is_not_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hooks.run"):
        Registration(tmp_path, "noop", "Ignore", None, None).write(_hook(tmp_path))  # type: ignore[arg-type]
    assert (tmp_path / "noop.json").is_file()
    assert not [r for r in caplog.records if r.name == "hooks.run" and r.levelno >= logging.WARNING]


def test_a_registration_that_cannot_be_removed_is_an_error_line_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hook directory remounted read-only: remove() raised EROFS (out of
    ``hook run``'s stop: test_run.py has the stop itself)."""
    registration = Registration(tmp_path, "noop", "Ignore", None, None)
    registration.write(_hook(tmp_path))  # type: ignore[arg-type]

    def read_only(self: Path, missing_ok: bool = False) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "unlink", read_only)
    with caplog.at_level(logging.ERROR, logger="hooks.run"):
        assert registration.remove() is False
    assert registration.left
    [record] = [r for r in caplog.records if r.name == "hooks.run"]
    assert "cannot remove the registration" in record.getMessage()
    assert record.hook_file == str(tmp_path / "noop.json") and "Read-only file system" in record.error  # type: ignore[attr-defined]
    assert (tmp_path / "noop.json").is_file()


def test_a_registration_replaced_on_the_same_inode_is_left(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """ext4 gives a file just freed's inode to the next one made, so another
    writer's registration can have this one's (st_dev, st_ino): its times
    differ. (Written in place here, so the inode is the same for certain.)
    Before: it was taken for this process's, and removed."""
    registration = Registration(tmp_path, "noop", "Ignore", None, None)
    registration.write(_hook(tmp_path))  # type: ignore[arg-type]
    path = tmp_path / "noop.json"
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.write(b" ")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert os.stat(path).st_ino == before.st_ino
    with caplog.at_level(logging.WARNING, logger="hooks.run"):
        assert registration.remove() is False
    assert path.is_file()
    assert [r.getMessage() for r in caplog.records if r.name == "hooks.run"] == [
        "registration was replaced by another writer; leaving it"]
