"""Whether a hook file, or the hook directory, may be trusted, and reading a
hook file as checked: whoever can write into the hook directory can change
every container on the node, so a directory or file writable by group or
others, or not owned by root or the current euid, is refused (for a symlink:
its resolved target and the target's directory). :mod:`.hookfile` parses
what is read; :mod:`.hookdir` checks the directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..shown import shown

__all__ = ["MAX_HOOK_FILE_SIZE", "HookConfigError", "check_path_safety", "read_hook_file", "unsafe_reason"]

MAX_HOOK_FILE_SIZE = 1 << 20  # a hook file is a few hundred bytes; refuse absurd ones


class HookConfigError(Exception):
    """A hook file was rejected; ``reason`` says why (each of ``problems``, in
    one line), ``path`` names the file; ``transient``: the file could not be
    read now (EMFILE, EIO...), which says nothing of what it holds;
    ``unsafe``: refused for its owner or mode, its content unread."""

    def __init__(
        self, path: Path | str, reason: str, transient: bool = False, *,
        problems: tuple[str, ...] = (), unsafe: bool = False,
    ) -> None:
        self.path = Path(path)
        self.problems = problems or (reason,)
        self.reason = reason
        self.transient = transient
        self.unsafe = unsafe
        super().__init__(f"hook config {self.path}: {reason}")


def unsafe_reason(st: os.stat_result, what: str) -> str | None:
    """Why a stat result is not trusted, or None if it is."""
    euid = os.geteuid()
    if st.st_uid not in (0, euid):
        return f"{what} is owned by uid {st.st_uid}, not root or the current euid {euid}"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if mode & bit)
        return f"{what} is writable by {who} (mode {mode:04o}); it must not be group/other-writable"
    return None


def check_path_safety(path: Path, what: str = "path") -> str | None:
    """Return why ``path`` (followed if a symlink) is not trusted, or None if it is safe.

    Missing paths and stat errors are reported as reasons too.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot stat {what} {path}: {exc.strerror or exc}"
    return unsafe_reason(st, f"{what} {path}")


def read_hook_file(path: Path, check_permissions: bool, *, follow_symlinks: bool = True) -> tuple[bytes, int]:
    """Open ``path`` (following symlinks, unless not ``follow_symlinks``: a
    symlink is then an error), check the opened inode and return (its
    content, its owner uid).

    The permission check is done on the opened file descriptor so that what is
    checked is what is read.
    """
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as exc:
        try:
            link = os.readlink(path)
        except OSError:  # not a symlink, or removed meanwhile
            raise HookConfigError(path, "file does not exist") from exc
        raise HookConfigError(path, f"dangling symlink (target {shown(link)} does not exist)") from exc
    except OSError as exc:
        raise HookConfigError(path, f"cannot open: {exc.strerror or exc}", transient=True) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HookConfigError(path, "not a regular file")
        if check_permissions:
            target = Path(os.path.realpath(path))
            real_dir = Path(os.path.realpath(path.parent))
            what = "file" if target == real_dir / path.name else f"symlink target {target}"
            reason = unsafe_reason(st, what)
            if reason is None and target.parent != real_dir:
                # A symlink into another directory: whoever can write that
                # directory can replace the target.
                reason = check_path_safety(target.parent, "symlink target directory")
            if reason is not None:
                raise HookConfigError(path, f"refused: {reason}", unsafe=True)
        if st.st_size > MAX_HOOK_FILE_SIZE:
            raise HookConfigError(path, f"file too large ({st.st_size} bytes > {MAX_HOOK_FILE_SIZE})")
        data = b""  # the size may change under us: read at most one byte past the limit
        while len(data) <= MAX_HOOK_FILE_SIZE and (chunk := os.read(fd, MAX_HOOK_FILE_SIZE + 1 - len(data))):
            data += chunk
        if len(data) > MAX_HOOK_FILE_SIZE:
            raise HookConfigError(path, f"file too large (> {MAX_HOOK_FILE_SIZE} bytes)")
        return data, st.st_uid
    except OSError as exc:
        raise HookConfigError(path, f"cannot read: {exc.strerror or exc}", transient=True) from exc
    finally:
        os.close(fd)
