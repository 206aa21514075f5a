"""Reserved CPUs given as a quantity, saved for a restart (``stateDir``).

What the containers run on does not always tell a restart which CPUs were
reserved (planning.reserved_to_keep): idle CPUs only the reserved type's
containers share look reserved, and with no reserved container running a
CPU a reload or hotplug chose is lost. So, with ``stateDir`` set, the hook
writes the reserved set, and a fingerprint of the config it was chosen
under, to ``<stateDir>/reserved.json`` once the start-up rebuild is done and
whenever a reload or hotplug changes either; a restart keeps that set, as a
reload keeps the reserved CPUs it had, when it is consistent with what runs
(:func:`judge`) or the balloons saved with it fit the restart (they put back
every container off it: savedstart.py), else deduces them as without it.

Written as batchresource's state files (``hooks.statefile``): to a
temporary file, fsync-ed and renamed into place, the directory fsync-ed: a
crash leaves the old file or the new one. A kill before the rename leaves
the temporary file (``.reserved.json.<random>.tmp``); the next start removes
it as it reads the file, in its start-up rebuild: the hook's socket lock is
its own then, and a stopping instance writes nothing once it has let the
lock go (savedset.py: when and by whom).

It names the node that wrote it (nodeid.py: its machine id), and a
restart on another node refuses it (a stateDir copied whole from another
node passes every other check); one naming no node, an older hook's, is
trusted as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ..statefile import read_json, remove_durably, remove_leftovers, temp_glob, write_atomic
from .balloon import ContainerKey
from .config import RESERVED, BalloonsConfig
from .nodeid import foreign, stamp
from .planning import Restored, type_or_default
from .topology import Topology, format_cpuset, parse_cpuset

log = logging.getLogger("hooks.balloons")

FILE_NAME = "reserved.json"
VERSION = 1


class SavedReservedError(ValueError):
    """The saved file cannot be used; the message says why. ``containers``:
    judge's, every container found contradicting the saved set (empty: the
    file itself, not what runs, is refused)."""

    def __init__(self, message: str, containers: frozenset[ContainerKey] = frozenset()) -> None:
        super().__init__(message)
        self.containers = containers


@dataclass(frozen=True)
class SavedReserved:
    cpus: frozenset[int]
    config: str  # fingerprint() of the config they were chosen under
    # A random id of the write, which balloons.json (savedplan.py) names too:
    # the balloons are used only with the reserved.json written with them.
    # "": none (read from an older hook's file; or not written yet).
    token: str = field(default="", compare=False)


def fingerprint(config: BalloonsConfig) -> str:
    """The keys placement goes by (those BalloonsConfig.plans_as compares),
    hashed. A field at its default is left out, at every level: a key a
    later version adds (at a default that keeps placement as it was) leaves
    the fingerprint of a config that does not set it as it was, so the first
    restart after an upgrade still judges the saved set under its config."""
    text = json.dumps(_set_fields(config.for_placement()), sort_keys=True, default=sorted)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _set_fields(value: Any) -> Any:
    """``value`` as JSON-able data, each dataclass a mapping of its fields not at their default."""
    if is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in fields(value):
            item = getattr(value, f.name)
            if f.default is not MISSING and item == f.default:
                continue
            if f.default_factory is not MISSING and item == f.default_factory():
                continue
            out[f.name] = _set_fields(item)
        return out
    if isinstance(value, (tuple, list)):
        return [_set_fields(item) for item in value]
    if isinstance(value, Mapping):
        return {str(k): _set_fields(v) for k, v in value.items()}
    return value


class ReservedFile:
    """``<directory>/reserved.json``; ``node``: this node's machine id ("":
    none), named in the file (nodeid.stamp) and checked at load
    (nodeid.foreign)."""

    def __init__(self, directory: Path, node: str = "") -> None:
        self.path = directory / FILE_NAME
        self.node = node

    def load(self) -> SavedReserved | None:
        """The saved set; None if there is none. Runs at start, before this
        hook saves anything: a temporary file is a killed hook's, removed."""
        self._remove_leftovers()
        doc = read_json(self.path, SavedReservedError)
        if doc is None:
            return None
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            raise SavedReservedError(f"is not a version {VERSION} reserved-CPUs file")
        if (why := foreign(doc, self.node)) is not None:
            raise SavedReservedError(why)
        cpus, config, token = doc.get("reserved_cpus"), doc.get("config"), doc.get("token", "")
        if not isinstance(cpus, str) or not isinstance(config, str) or not isinstance(token, str):
            raise SavedReservedError("lacks reserved_cpus or config, or has a token not a string")
        try:
            parsed = parse_cpuset(cpus)
        except ValueError as exc:
            raise SavedReservedError(f"has a bad reserved_cpus {cpus[:40]!r}: {exc}") from None
        if not parsed:
            raise SavedReservedError("names no reserved CPU")
        return SavedReserved(parsed, config, token)

    def _remove_leftovers(self) -> None:
        remove_leftovers(self.path.parent, temp_glob(FILE_NAME), log, "balloons")  # the names save() gives them

    def save(self, saved: SavedReserved) -> None:
        """Write ``saved`` in place of the file, atomically (OSError)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"version": VERSION, "reserved_cpus": format_cpuset(saved.cpus), "config": saved.config, "token": saved.token}
        write_atomic(self.path, (json.dumps(stamp(doc, self.node)) + "\n").encode())

    def remove(self) -> None:
        """Remove the file, if there (OSError)."""
        remove_durably(self.path)


def judge(config: BalloonsConfig, topology: Topology, found: Iterable[Restored], saved: SavedReserved) -> frozenset[int]:
    """The saved reserved CPUs online, if what runs is consistent with them;
    else SavedReservedError saying what is not. Containers touching a
    reserved CPU run on all of them: the reserved balloon's (and on idle
    CPUs, when its type shares them) and those of a balloon without CPUs
    (on them alone); no other runs on any. Under the config they were saved
    under, the types tell more: the reserved type's containers run on all of
    them, no other type's on one unless on them alone, and they are as many
    as it asks. A container that does not, was not moved to them (the hook
    stopped before its move), or the file is another's: what runs tells more.
    Under another config, a container's type may have changed: only one
    running on some of them and not all tells."""
    online = saved.cpus & topology.all_cpus
    if not online:
        raise SavedReservedError(f"names CPUs {format_cpuset(saved.cpus)}, none of them online")
    same = saved.config == fingerprint(config)
    if same and len(saved.cpus) != config.reserved_count:
        raise SavedReservedError(f"names {len(saved.cpus)} CPUs, where the config it was saved under asks {config.reserved_count}")
    why: dict[ContainerKey, str] = {}  # each container contradicting them: the first says why
    for item in found:
        cpus = item.cpus & topology.all_cpus
        if not cpus or cpus == topology.all_cpus:
            continue  # not pinned: says nothing
        on = cpus & online
        label, runs = item.member.label, f"runs on {format_cpuset(cpus)}"
        btype = type_or_default(config, item.pod)[0]
        if on and on != online:
            why[item.member.key] = f"container {label} {runs}, some of them only"
        elif same and btype.name == RESERVED and not on:
            why[item.member.key] = f"container {label} of the reserved balloon {runs}, none of them"
        elif same and btype.name != RESERVED and on and cpus != online:
            why[item.member.key] = f"container {label} of balloon type {btype.name} {runs}, not the reserved CPUs alone"
    if why:
        first, *more = why.values()
        also = f" (and {len(more)} other container(s))" if more else ""
        raise SavedReservedError(f"names CPUs {format_cpuset(online)}, but {first}{also} "
                                 "(a move not done before the hook stopped?)", frozenset(why))
    return online


class AtRestart(NamedTuple):
    """The reserved CPUs a restart keeps (restoring.rebuild's ``reserved``;
    None: deduced from what runs), and why, for the log."""

    reserved: frozenset[int] | None
    why: str
    level: int = logging.INFO
