"""The running BE pods the hook manages, kept in a state dir so a restarted hook still knows them.

One small JSON file per pod (``<uid>.json``), written to a temporary file,
fsync-ed and renamed into place: a crash leaves the old file or the new one,
never half of one (a kill before the rename leaves the temporary file, which
the next start removes). The pod's annotation text is kept rather than computed
values, so a changed config (the CFS quota switch) applies after a restart.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["PodRecord", "StateDir", "pod_key"]

log = logging.getLogger(__name__)
_SAFE_UID = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    cgroup_parent: str
    spec: str  # the extended-resource-spec annotation, verbatim

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def key(self) -> str:
        return pod_key(self.uid, self.namespace, self.name)


def pod_key(uid: str, namespace: str, name: str) -> str:
    """What the hook tells a pod by: its uid, or, for a pod with none (CRI
    allows it: ``crictl runp`` without one), its namespace and name, which the
    runtime keeps unique among pods with one uid. The NUL keeps that key apart
    from every uid a state file can be named after."""
    return uid if uid else f"\0{namespace}/{name}"


class StateDir:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, uid: str) -> Path:
        if not _SAFE_UID.fullmatch(uid) or uid in (".", ".."):
            raise ValueError(f"pod uid {uid!r} cannot name a state file")
        return self.directory / f"{uid}.json"

    def load(self) -> dict[str, PodRecord]:
        """Every readable record; unreadable files are logged and skipped (never fatal).
        Runs at start, before this hook saves anything: a temporary file is a
        killed hook's, whose record is the ``.json`` beside it or was never there."""
        records: dict[str, PodRecord] = {}
        if not self.directory.is_dir():
            return records
        self._remove_leftovers()
        for path in sorted(self.directory.glob("*.json")):
            try:
                record = PodRecord(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError) as exc:
                log.warning("unreadable batchresource state file skipped", extra={"path": str(path), "error": str(exc)})
                continue
            records[record.uid] = record
        return records

    def _remove_leftovers(self) -> None:
        for path in sorted(self.directory.glob(".*.tmp")):  # the names save() gives its temporary files
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("batchresource cannot remove a temporary state file a stopped hook left",
                            extra={"path": str(path), "error": str(exc)})
                continue
            log.info("batchresource removed a temporary state file a stopped hook left", extra={"path": str(path)})

    def save(self, record: PodRecord) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self._path(record.uid)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{record.uid}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(asdict(record), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def remove(self, uid: str) -> None:
        self._path(uid).unlink(missing_ok=True)
