"""The saved-set writer's file I/O (savedset.py), run in a thread: both
files written or removed, a failure naming the file it was on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .savedplan import PlanFile, SavedPlan
from .savedreserved import ReservedFile, SavedReserved


class FileFailed(Exception):
    """``error`` writing or removing ``path``."""

    def __init__(self, path: Path, error: OSError) -> None:
        super().__init__(f"{path}: {error}")
        self.path, self.error = path, error


def save(reserved: ReservedFile, plan: PlanFile, saved: SavedReserved, balloons: SavedPlan | None,
         with_reserved: bool) -> None:
    """The set (unless ``with_reserved`` is False: the file there already
    holds it, with ``saved.token``), then the balloons (none: that file
    removed), each atomically and carrying ``saved.token`` (FileFailed)."""
    if with_reserved:
        try:
            reserved.save(saved)
        except OSError as exc:
            raise FileFailed(reserved.path, exc) from exc
    try:
        if balloons is None:
            plan.remove()
        else:
            plan.save(dataclasses.replace(balloons, token=saved.token))
    except OSError as exc:
        raise FileFailed(plan.path, exc) from exc


def remove(reserved: ReservedFile, plan: PlanFile) -> None:
    """Both files, each tried (FileFailed: the first that failed)."""
    failed: FileFailed | None = None
    for file in (reserved, plan):
        try:
            file.remove()
        except OSError as exc:
            failed = failed or FileFailed(file.path, exc)
    if failed is not None:
        raise failed
