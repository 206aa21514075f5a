"""What a hook directory is as a rescan finds it, and which of its files are hook files."""

from __future__ import annotations

import enum
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .filesafety import unsafe_reason

__all__ = ["DirectoryState", "Inspection", "inspect_directory", "list_hook_files"]

logger = logging.getLogger("runtimeproxy.hookpath.registry")  # its lines belong to the registry's


class DirectoryState(enum.Enum):
    USABLE = "usable"
    GONE = "gone"  # missing: no hooks at all
    NOT_A_DIRECTORY = "not a directory"  # a file in its place (or its path's): the last good set stays
    UNREADABLE = "unreadable"  # cannot be stat'ed or listed now: the last good set stays
    UNSAFE = "unsafe"  # writable by others: the last good set stays


@dataclass(frozen=True)
class Inspection:
    state: DirectoryState
    problem: str | None = None  # why it is not usable
    level: int = logging.INFO  # the problem's log level

    @property
    def keeps_last_good(self) -> bool:
        return self.state is not DirectoryState.USABLE and self.state is not DirectoryState.GONE

    @property
    def until(self) -> str:
        """What ends a problem that keeps the last good set, for its log line."""
        if self.state is DirectoryState.UNSAFE:
            return "it is safe again"
        if self.state is DirectoryState.NOT_A_DIRECTORY:
            return "it is a directory again (or is removed)"
        return "it can be read again"


def inspect_directory(directory: Path, check_permissions: bool) -> Inspection:
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        # Normal before the first hook server registers: not an error.
        return Inspection(DirectoryState.GONE, f"hook directory {directory} does not exist", logging.WARNING)
    except NotADirectoryError:  # a file where one of its parents should be: a broken config, as below
        problem = f"hook directory {directory} is not a directory: a file is in its path"
        return Inspection(DirectoryState.NOT_A_DIRECTORY, problem, logging.ERROR)
    except OSError as exc:  # EACCES, EIO, ENOMEM...: says nothing of what it holds
        problem = f"cannot stat hook directory {directory}: {exc.strerror or exc}"
        return Inspection(DirectoryState.UNREADABLE, problem, logging.ERROR)
    if not stat.S_ISDIR(st.st_mode):
        # A file written where the directory was is a broken hook config, not an
        # operator's word that no hook should run: as for a broken hook file, the
        # last good set stays (dropping it would let calls pass their Fail hooks).
        return Inspection(DirectoryState.NOT_A_DIRECTORY, f"hook directory {directory} is not a directory", logging.ERROR)
    if check_permissions:
        reason = unsafe_reason(st, f"hook directory {directory}")
        if reason is not None:
            return Inspection(DirectoryState.UNSAFE, f"refusing to load any hook: {reason}", logging.ERROR)
    return Inspection(DirectoryState.USABLE)


def list_hook_files(directory: Path) -> list[Path]:
    """The directory's ``*.json`` files (symlinks to files included), by name;
    hidden ones and sub-directories are skipped. Raises OSError if it cannot be listed."""
    candidates = []
    with os.scandir(directory) as it:
        for entry in it:
            if not entry.name.endswith(".json"):
                continue
            if entry.name.startswith("."):
                logger.debug("skipping hidden hook file %s", entry.name, extra={"hook_file": entry.name})
                continue
            try:
                if entry.is_dir():  # follows symlinks
                    continue
            except OSError:
                pass
            candidates.append(Path(entry.path))
    return sorted(candidates, key=lambda p: p.name)
