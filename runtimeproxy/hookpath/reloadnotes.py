"""What a hook registry's rescans log: each hook file loaded, changed,
removed, rejected, and the end of its rejection; the directory's problems and
their end. Each problem once, until it changes, not at every rescan."""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from pathlib import Path

from .hookfile import HookServerConfig

__all__ = ["ReloadNotes"]

logger = logging.getLogger(__package__ + ".registry")  # an operator finds the directory's whole story in one place


class ReloadNotes:
    """The log lines of one registry's rescans, and what they remember so as
    to say each problem once (owned by the registry: not shared)."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._rejection_fingerprints: dict[str, tuple[object, ...]] = {}
        self.directory_error: str | None = None  # the directory's problem logged last

    def changes(
        self, old: Mapping[str, HookServerConfig], new: Mapping[str, HookServerConfig],
        was_rejected: Collection[str], rejected: Collection[str],
    ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """Log each file added, changed, removed, and each rejection that
        ended; returns the names (added, changed, removed)."""
        added = tuple(n for n in sorted(new) if n not in old)
        changed = tuple(n for n in sorted(new) if n in old and old[n] != new[n])
        removed = tuple(n for n in sorted(old) if n not in new)
        # A rejection ends as the file is fixed (loaded or changed: those lines say
        # so), put back as its last good version (restored), or removed.
        ended = {n for n in was_rejected if n not in rejected}
        for name in added:
            self._in_force("loaded", name, new[name], ended, "")
        for name in changed:
            self._in_force("changed", name, new[name], ended, f" (was {old[name].describe()})")
        for name in sorted(n for n in ended if n in new and n in old and old[n] == new[n]):
            cfg = new[name]
            logger.info(
                "hook config rejection ended: file=%s restored to its last good version, which stays in force: %s",
                name, cfg.describe(), extra={**cfg.log_fields(), "hook_event": "restored", "hook_rejection_ended": "restored"},
            )
        for name in removed:
            cfg = old[name]
            if name in ended:  # its last good version was kept in force through the rejection
                logger.info(
                    "hook config rejection ended: file=%s removed; its last good version, in force until now, "
                    "is removed with it: %s", name, cfg.describe(),
                    extra={**cfg.log_fields(), "hook_event": "removed", "hook_rejection_ended": "removed"},
                )
            else:
                logger.info("hook config removed: file=%s %s", name, cfg.describe(), extra={**cfg.log_fields(), "hook_event": "removed"})
        for name in sorted(n for n in ended if n not in new and n not in old):
            logger.info(
                "hook config rejection ended: file=%s removed; no version of it was in force, nor is now", name,
                extra={"hook_file": name, "hook_event": "removed", "hook_rejection_ended": "removed"},
            )
        return added, changed, removed

    @staticmethod
    def _in_force(event: str, name: str, cfg: HookServerConfig, ended: Collection[str], was: str) -> None:
        extra: dict[str, object] = {**cfg.log_fields(), "hook_event": event}
        fixed = ""
        if name in ended:
            extra["hook_rejection_ended"] = "fixed"
            fixed = "; its rejection ended"
        logger.info("hook config %s: file=%s %s%s%s", event, name, cfg.describe(), was, fixed, extra=extra)

    def kept_directory(self, problem: str, only_changes: bool, until: str, kept: Mapping[str, HookServerConfig]) -> None:
        """Log a directory whose last good hook set stays (``only_changes``: when its problem changed)."""
        if not only_changes or problem != self.directory_error:
            if kept:
                what = f"keeping the last good hook set of {len(kept)} server(s) ({', '.join(kept)})"
            else:
                what = "no hooks are active"
            logger.error(
                "%s; %s and loading no change from it until %s", problem, what, until,
                extra={"hook_dir": str(self._directory), "reason": problem, "hook_kept_files": sorted(kept)},
            )
        self.directory_error = problem

    def directory_problem(self, problem: str | None, level: int) -> None:
        """Log a directory problem once, and its end."""
        fields = {"hook_dir": str(self._directory)}
        if problem is not None:
            if problem != self.directory_error:
                logger.log(level, "%s; no hooks are active", problem, extra={**fields, "reason": problem})
            self._rejection_fingerprints.clear()
        elif self.directory_error is not None:
            logger.info("hook directory %s is usable again", self._directory, extra=fields)
        self.directory_error = problem

    def accepted(self, name: str) -> None:
        """``name`` was read and is valid: a later rejection of it is news."""
        self._rejection_fingerprints.pop(name, None)

    def keep_rejections(self, names: Collection[str]) -> None:
        """Forget what was logged of files no longer rejected."""
        for name in [n for n in self._rejection_fingerprints if n not in names]:
            del self._rejection_fingerprints[name]

    def rejection(self, path: Path, reason: str, previous: HookServerConfig | None) -> None:
        """Log a file rejected, unless this very rejection of it was logged already."""
        try:
            st = os.lstat(path)
            identity: tuple[object, ...] = (st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode, st.st_uid)
        except OSError:
            identity = ()
        fingerprint = (reason, identity, previous)
        name = path.name
        if self._rejection_fingerprints.get(name) == fingerprint:
            logger.debug("hook config %s still rejected: %s", name, reason, extra={"hook_file": name, "reason": reason})
            return
        self._rejection_fingerprints[name] = fingerprint
        extra: dict[str, object] = {"hook_file": name, "hook_event": "rejected", "reason": reason}
        if previous is not None:
            extra["hook_endpoint"] = previous.endpoint
            extra["hook_points"] = sorted(h.value for h in previous.hooks)
            logger.error(
                "hook config rejected: file=%s reason=%s; keeping its last good version (%s)", name, reason,
                previous.describe(), extra={**extra, "hook_kept_last_good": True},
            )
        else:
            logger.error("hook config rejected: file=%s reason=%s", name, reason, extra=extra)
