"""The balloons saved for a restart (``stateDir``): ``<stateDir>/balloons.json``.

A restart that knows only the cpusets containers run on guesses the
balloons (rebuilding.py): a pod split over balloons of its type, or a
container its type could not take in the default balloon, is regrouped, as
the cpusets do not tell those balloons apart. So, with ``stateDir`` set, the
hook saves its plan too: each balloon's type, index, own CPUs, the cpuset its
containers were given and which containers it holds, with the reserved CPUs
and the config's fingerprint. A restart rebuilds from it as a reload of the
same config does (:func:`.restoring.replan`: each container back in
its balloon, which keeps its name and place in the order) when it still
fits (:func:`rebuild_from`: the same config, its CPUs online), else as
without it, saying why. A container found off its saved balloon's cpuset
is put back there and moved, as a reload does (placed elsewhere if it no
longer fits there: its request grew while the hook was down); one it does
not hold is placed as a new one, in the order they were created
(:func:`agree`, :func:`rebuild_from`).

Written by the reserved set's one writer (savedset.py), after reserved.json,
atomically (``hooks.statefile``); it carries the token of the reserved.json
written with it, and is used only beside that one (not after a crash between
the two writes, an older hook's run on the directory, or with reserved.json
gone); the reserved CPUs it names must be those the restart keeps too.
Like reserved.json it names the node that wrote it, and is refused on
another node (nodeid.py).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..statefile import read_json, remove_durably, remove_leftovers, temp_glob, write_atomic
from . import planning, replanning, restoring
from .balloon import Balloon, ContainerKey
from .config import DEFAULT, BalloonsConfig
from .nodeid import foreign, stamp
from .planning import Restored
from .savedreserved import fingerprint
from .state import Assignments
from .topology import Topology, format_cpuset, parse_cpuset

log = logging.getLogger("hooks.balloons")

FILE_NAME = "balloons.json"
VERSION = 1


class SavedPlanError(ValueError):
    """The saved balloons cannot be used; the message says why."""


class SavedPlanNewer(SavedPlanError):
    """The file is of a later version (a newer hook wrote it, then was downgraded)."""


@dataclass(frozen=True)
class SavedBalloon:
    btype: str
    index: int
    cpus: frozenset[int]  # its own
    cpuset: frozenset[int]  # what its containers were given (idle CPUs shared, or the reserved ones)
    members: tuple[ContainerKey, ...]

    @property
    def name(self) -> str:
        return f"{self.btype}[{self.index}]"


@dataclass(frozen=True)
class SavedPlan:
    reserved: frozenset[int]
    config: str  # fingerprint() of the config it was made under
    balloons: tuple[SavedBalloon, ...]  # in the pool's order (placement tries them in it)
    # That of the reserved.json written with it (SavedReserved.token), set as
    # it is written: the plan is used only with that reserved.json.
    token: str = field(default="", compare=False)


def snapshot(state: Assignments, config_print: str | None = None) -> SavedPlan:
    """``state``'s balloons, to save (``config_print``: fingerprint() of its
    config, if known: computed otherwise)."""
    pool = state.pool
    return SavedPlan(pool.reserved, config_print or fingerprint(state.config), tuple(
        SavedBalloon(b.btype.name, b.index, b.cpus, pool.effective_cpus(b), tuple(sorted(b.members)))
        for b in pool.balloons
    ))


def _to_doc(plan: SavedPlan) -> dict[str, Any]:
    return {"version": VERSION, "token": plan.token, "reserved_cpus": format_cpuset(plan.reserved), "config": plan.config, "balloons": [
        {"type": b.btype, "index": b.index, "cpus": format_cpuset(b.cpus), "cpuset": format_cpuset(b.cpuset),
         "members": [list(key) for key in b.members]}
        for b in plan.balloons
    ]}


def _from_doc(doc: Any) -> SavedPlan:
    version = doc.get("version") if isinstance(doc, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        raise SavedPlanNewer(f"is of version {version}, written by a later hook (this one reads version {VERSION})")
    if version != VERSION:
        raise SavedPlanError(f"is not a version {VERSION} balloons file")
    try:
        balloons = tuple(
            SavedBalloon(str(b["type"]), int(b["index"]), parse_cpuset(b["cpus"]), parse_cpuset(b["cpuset"]),
                         tuple((str(uid), str(name)) for uid, name in b["members"]))
            for b in doc["balloons"]
        )
        return SavedPlan(parse_cpuset(doc["reserved_cpus"]), str(doc["config"]), balloons, str(doc.get("token", "")))
    except (KeyError, TypeError, ValueError) as exc:
        raise SavedPlanError(f"is malformed ({type(exc).__name__}: {exc})") from None


class PlanFile:
    """``<directory>/balloons.json``; ``node``: this node's machine id ("":
    none), named in the file (nodeid.stamp) and checked at load
    (nodeid.foreign)."""

    def __init__(self, directory: Path, node: str = "") -> None:
        self.path = directory / FILE_NAME
        self.node = node

    def load(self) -> SavedPlan | None:
        """The saved plan; None if there is none (an older hook's stateDir).
        A killed hook's temporary file is removed (at start, the lock held)."""
        remove_leftovers(self.path.parent, temp_glob(FILE_NAME), log, "balloons")
        doc = read_json(self.path, SavedPlanError)
        if doc is None:
            return None
        plan = _from_doc(doc)  # its version first: a later one is an info line, whatever node it names
        if (why := foreign(doc, self.node)) is not None:
            raise SavedPlanError(why)
        return plan

    def save(self, plan: SavedPlan) -> None:
        """Write ``plan`` in place of the file, atomically (OSError)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, (json.dumps(stamp(_to_doc(plan), self.node)) + "\n").encode())

    def remove(self) -> None:
        remove_durably(self.path)


class Agreement(NamedTuple):
    """What runs, matched with the saved balloons (:func:`agree`)."""

    restored: list[Restored]  # each saved member found, with its saved balloon (planned)
    put_back: list[Restored]  # those of them not on that balloon's cpuset (astray: moved back there)
    new: list[Restored]  # found in no saved balloon: placed as new ones


def agree(config: BalloonsConfig, topology: Topology, found: list[Restored], plan: SavedPlan) -> Agreement:
    """``found``, each with the balloon ``plan`` had it in (as a re-plan's,
    replanning.restored), if the plan fits this restart: made under this
    config, its CPUs online; else SavedPlanError saying what does not. Every
    balloon's type is one the config defines: the fingerprint covers the types.

    A container found in a saved balloon but not on its cpuset (a move not
    done before the hook stopped; restarted by kubelet while the hook was
    down, so on every CPU; a runtime that shows no spec) goes back to that
    balloon as a reload puts back one whose move was refused (``astray``:
    its balloon's own CPUs, moved there), not by what it runs on, which
    tells nothing of its balloon; with pinCPU false none is compared, none
    being pinned. One in no saved balloon (started while the hook was down,
    or after the last write) is placed afterwards as a new one
    (Assignments.adopt). Saved members not found are dropped."""
    if plan.config != fingerprint(config):
        raise SavedPlanError("was saved under another config (a restart after a config change rebuilds from the cpusets)")
    offline = frozenset().union(plan.reserved, *(b.cpuset for b in plan.balloons)) - topology.all_cpus
    if offline:
        raise SavedPlanError(f"names CPUs {format_cpuset(offline)}, offline now")
    where = {key: b for b in plan.balloons for key in b.members}
    out, put_back, new = [], [], []
    for item in found:
        balloon = where.get(item.member.key)
        if balloon is None:
            new.append(item)
            continue
        astray = config.pin_cpu and item.cpus != balloon.cpuset
        chosen = planning.type_or_default(config, item.pod)[0].name
        pinned = frozenset() if topology.all_cpus <= item.cpus else item.cpus
        restored = Restored(
            member=item.member, pod=item.pod, cpus=pinned, mems=item.mems, answers=item.answers,
            planned=planning.Planned(balloon.btype, balloon.cpus - plan.reserved, balloon.index), astray=astray,
            fallback=chosen if balloon.btype == DEFAULT != chosen else "", everywhere=item.cpus - pinned,
        )
        out.append(restored)
        if astray:
            put_back.append(restored)
    return Agreement(out, put_back, new)


LISTED = 20  # containers named in a log line's fields, each list: the rest counted


def listed(items: list[str]) -> list[str]:
    """``items`` for a log line's field: the first LISTED, then how many more
    (with hundreds of containers a restart's line stays short)."""
    more = len(items) - LISTED
    return items if more <= 0 else [*items[:LISTED], f"and {more} more"]


class SavedRestart(NamedTuple):
    """A restart's state rebuilt from the saved balloons (:func:`rebuild_from`), and what it changed."""

    state: Assignments
    # container -> (its label, its saved balloon): found off its cpuset, back
    # in it (a saved reserved set refused for such ones is kept only if each
    # is back in its balloon: savedstart.py)
    put_back: dict[ContainerKey, tuple[str, str]]
    # container -> (its label, its saved balloon, the one it is in): found
    # off its cpuset, it no longer fits its saved balloon (its request grew
    # while the hook was down), and was placed elsewhere
    not_put_back: dict[ContainerKey, tuple[str, str, str]]
    # container -> (its label, its balloon): found in none saved, placed as a new one
    placed: dict[ContainerKey, tuple[str, str]]
    moves: list[str]  # labels of the containers whose cpuset is to be moved

    def summary(self) -> str:
        """For the log line (empty if it is as saved): counts only, the
        containers are in :meth:`fields`."""
        parts = []
        if self.put_back:
            parts.append(f"{len(self.put_back)} container(s) put back in their saved balloon")
        if self.not_put_back:
            parts.append(f"{len(self.not_put_back)} not put back in their saved balloon, which has no room for them now")
        if self.placed:
            parts.append(f"{len(self.placed)} not in a saved balloon placed as new")
        if self.moves:
            parts.append(f"{len(self.moves)} to move")
        return "; ".join(parts)

    def fields(self) -> dict[str, list[str]]:
        """The containers :meth:`summary` counts, for the log line's fields (listed())."""
        return {
            "put_back": listed([f"{label} in {name}" for label, name in self.put_back.values()]),
            "not_put_back": listed([f"{label} saved in {saved}, now {now}"
                                    for label, saved, now in self.not_put_back.values()]),
            "placed": listed([f"{label} in {name}" for label, name in self.placed.values()]),
            "moves": listed(self.moves),
        }


def rebuild_from(config: BalloonsConfig, topology: Topology, found: list[Restored], plan: SavedPlan) -> SavedRestart:
    """The balloons of ``plan`` for the containers ``found`` running, rebuilt
    as a reload of the same config rebuilds them (each keeps its containers,
    own CPUs, name and place; its empty ones too; one off its balloon's
    cpuset goes back to it, if it still fits there, and is moved), then
    those it does not hold placed as new ones, if it fits this restart
    (:func:`agree`) and the reserved CPUs come out as saved; else
    SavedPlanError."""
    agreed = agree(config, topology, found, plan)
    empty = [Balloon(config.types_by_name[b.btype], b.index, b.cpus) for b in plan.balloons
             if not b.members and b.btype in config.types_by_name]
    state = restoring.rebuild(config, topology, agreed.restored, plan.reserved, empty, rehome=False)
    if state.pool.reserved != plan.reserved:
        raise SavedPlanError(f"names reserved CPUs {format_cpuset(plan.reserved)}, but the config reserves "
                             f"{format_cpuset(state.pool.reserved)}")
    order = [Balloon(config.types_by_name.get(b.btype, state.pool.types[DEFAULT]), b.index, b.cpus)
             for b in plan.balloons if b.btype in config.types_by_name]
    replanning.keep_order(order, state.pool.balloons)
    # After the saved balloons have their containers and CPUs: placed first,
    # a new one could take CPUs of theirs, or a maxBalloons place. In the
    # order they were created, as they were placed at run time (the
    # runtime lists them in an order of its own), as reconcile adopts.
    new = sorted(agreed.new, key=lambda item: planning.creation_order(item.created, item.member.container_id))
    placed = {item.member.key: (item.member.label, state.adopt(item.member, item.pod, item.cpus, item.mems).name)
              for item in new}
    put_back, not_put_back = {}, {}
    for item in agreed.put_back:
        balloon = state.pool.balloon_of(item.member.key)
        assert balloon is not None and item.planned is not None  # the rebuild places every container found
        if balloon.name == item.planned.name:
            put_back[item.member.key] = (item.member.label, balloon.name)
        else:
            not_put_back[item.member.key] = (item.member.label, item.planned.name, balloon.name)
    return SavedRestart(state, put_back, not_put_back, placed, [move.label for move in state.moves()])
