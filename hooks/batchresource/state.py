"""The running BE pods the hook manages, kept in a state dir so a restarted hook still knows them.

One small JSON file per pod (``<uid>.json``), written to a temporary file,
fsync-ed and renamed into place (``hooks.statefile``): a crash leaves the old
file or the new one, never half of one. A kill before the rename leaves the
temporary file (``.<uid>.json.<random>.tmp``; an older version's
``.<uid>.<random>.tmp``), which the next start removes
once it holds the hook's socket lock (:meth:`StateDir.load`, from the hook's
``before_serving``): a second instance refused as the path is in use never
touches the live one's files. The pod's annotation text is kept rather than computed
values, so a changed config (the CFS quota switch) applies after a restart.

Beside the record, the file lists the containers the hook set values for
(``containers``: name and attempt, what PreCreateContainer is told; the id
is not known yet then), so the runtime listing can tell a container made
while the hook was down from one whose values another writer changed on
purpose. A file written before that list existed has none (``None``:
unknown, not empty).

It keeps kubelet's swap asks too (``swap``: container name -> the
``memory_swap_limit_in_bytes`` of its last CreateContainer or
UpdateContainerResources the hook saw), so a restarted hook still puts a
container's cgroup v1 memsw back where the runtime set it. A file without
``swap`` (written before asks were kept, or before any was noted) knows no
ask: those containers' memsw is only ever raised, never lowered, until
kubelet creates or updates them again.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..statefile import remove_leftovers, temp_glob, write_atomic

__all__ = ["ContainerKey", "PodRecord", "SavedPod", "StateDir", "pod_key"]

log = logging.getLogger(__name__)
_SAFE_UID = re.compile(r"[A-Za-z0-9_.-]+")
# balloons' saved reserved set and balloons (hooks.balloons.savedreserved's
# and savedplan's FILE_NAME): a stateDir shared with balloons holds them, and
# their temporary files, which are not this hook's to read or remove.
_NOT_OURS = ("reserved.json", "balloons.json")
# The temporary files of versions before the ``.<uid>.json.`` prefix (until
# 67d938d): ``.<uid>.<mkstemp's 8 random characters>.tmp``. Only for a uid
# without a dot (kubelet's are UUIDs): such a name is never one of today's
# (``.<name>.json.<random>.tmp``, ours or balloons'), so none is taken.
_OLD_TEMP = re.compile(r"\.[A-Za-z0-9_-]+\.[a-z0-9_]{8}\.tmp")

# A container of a pod as the hook is told of it (name, attempt): unique
# among a pod's containers (kubelet raises the attempt on every re-creation,
# across the pod's sandboxes).
ContainerKey = tuple[str, int]


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


@dataclass(frozen=True)
class SavedPod:
    """What a pod's file holds."""

    record: PodRecord
    containers: frozenset[ContainerKey] | None = None  # None: not known (a file from before the list)
    swap: Mapping[str, int] = field(default_factory=dict)  # kubelet's asks by container name; {}: none known


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

    def load(self) -> dict[str, SavedPod]:
        """Every readable file's pod, by uid; unreadable files are logged and skipped (never fatal).
        Call it once the hook holds its socket lock, before it saves anything:
        a temporary file is then a killed hook's, whose record is the
        ``.json`` beside it or was never there."""
        pods: dict[str, SavedPod] = {}
        if not self.directory.is_dir():
            return pods
        self._remove_leftovers()
        for path in sorted(self.directory.glob("*.json")):
            if path.name in _NOT_OURS:
                continue
            try:
                pod = _read(path)
            except (OSError, ValueError, TypeError) as exc:
                log.warning("unreadable batchresource state file skipped", extra={"path": str(path), "error": str(exc)})
                continue
            pods[pod.record.uid] = pod
        return pods

    def _remove_leftovers(self) -> None:
        theirs = tuple(f".{name}." for name in _NOT_OURS)
        ours = [p for p in self.directory.glob(temp_glob("*.json")) if not p.name.startswith(theirs)]
        ours += [p for p in self.directory.glob(".*.tmp") if _OLD_TEMP.fullmatch(p.name)]
        for path in sorted(ours):  # one at a time, through the shared helper's logging
            remove_leftovers(self.directory, path.name, log, "batchresource")

    def save(self, record: PodRecord, containers: frozenset[ContainerKey] | None = None, *,
             swap: Mapping[str, int] | None = None, sync_dir: bool = True) -> None:
        """``sync_dir=False``: the file is fsync-ed, not its rename (a power
        loss may leave the previous file, whole)."""
        saved: dict[str, object] = asdict(record)
        if containers is not None:
            saved["containers"] = [list(c) for c in sorted(containers)]
        if swap:  # (none: no key, the file as an older version wrote it, and reads it)
            saved["swap"] = dict(sorted(swap.items()))
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomic(self._path(record.uid), json.dumps(saved).encode(), sync_dir=sync_dir)

    def remove(self, uid: str) -> None:
        self._path(uid).unlink(missing_ok=True)


def _read(path: Path) -> SavedPod:
    """One file's pod (OSError, ValueError or TypeError for one that is not one)."""
    saved = json.loads(path.read_text())
    if not isinstance(saved, dict):
        raise ValueError("not a JSON object")
    listed = saved.pop("containers", None)  # (absent from an older version's file)
    # Absent from a file written before swap asks were kept (or before any
    # was noted): none known, so memsw is only raised until kubelet asks again.
    swap = saved.pop("swap", {})
    if not isinstance(swap, dict):
        raise ValueError(f"swap is not a mapping: {swap!r}")
    record = PodRecord(**saved)
    containers = None if listed is None else frozenset((str(name), int(attempt)) for name, attempt in listed)
    return SavedPod(record, containers, {str(name): int(asked) for name, asked in swap.items()})
