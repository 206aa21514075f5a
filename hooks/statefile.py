"""Small state files the hooks keep on disk, written so a crash never leaves half of one.

:func:`write_atomic` writes to a temporary file in the same directory
(named ``.<name>.<random>.tmp``, :func:`temp_glob`), fsync-s it, renames it
into place and fsync-s the directory: a crash leaves the old file or the new
one. A kill between the temporary file's creation and the rename leaves the
temporary file behind; its owner removes such leftovers
(:func:`remove_leftovers`) once it holds the hook's socket lock, so never
while another instance of the same hook may be writing one.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["fsync_dir", "read_json", "remove_durably", "remove_leftovers", "temp_glob", "write_atomic"]


def read_json(path: Path, error: type[Exception]) -> Any | None:
    """The JSON document in ``path``; None if there is no file. A file that
    cannot be read or is not JSON raises ``error`` saying so, as the end of a
    sentence that names the file ("... cannot be read: ...")."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot be read: {exc}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise error(f"is not JSON ({exc}): a file this hook did not write, or damaged") from None


def temp_glob(name: str) -> str:
    """The glob of the temporary files :func:`write_atomic` makes for a file named ``name``."""
    return f".{name}.*.tmp"


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` survive a power loss (OSError)."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_atomic(path: Path, data: bytes, *, mode: int | None = None, sync_dir: bool = True) -> None:
    """Write ``data`` in place of ``path``, atomically (OSError; the
    temporary file is removed on any failure). ``mode``: chmod-ed before the
    rename (else mkstemp's 0600). ``sync_dir=False`` leaves the directory's
    fsync to the caller (one that treats it as best effort)."""
    directory = path.parent
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(directory)


def remove_durably(path: Path) -> bool:
    """Remove ``path`` and fsync its directory; False if it was not there (OSError otherwise)."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    fsync_dir(path.parent)
    return True


def remove_leftovers(directory: Path, pattern: str, logger: logging.Logger, owner: str) -> int:
    """Remove the temporary files matching ``pattern`` (:func:`temp_glob`) a
    killed writer left in ``directory``; how many were removed. Each removal,
    or failure to remove, is logged as ``<owner> removed a temporary state
    file a stopped hook left``. Call it only while no other writer of these
    names can be running (the hook's socket lock held)."""
    removed = 0
    for path in sorted(directory.glob(pattern)):
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("%s cannot remove a temporary state file a stopped hook left", owner,
                           extra={"path": str(path), "error": str(exc)})
            continue
        removed += 1
        logger.info("%s removed a temporary state file a stopped hook left", owner, extra={"path": str(path)})
    return removed
