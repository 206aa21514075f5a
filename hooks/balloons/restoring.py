"""How :class:`~.state.Assignments` are rebuilt from what the containers
run on now: after a restart (from the cpusets; savedplan.py rebuilds from
the saved balloons through it too), and a re-plan on another config (a
reload) or machine (hotplug), which hands on what it knows of each balloon
(replanning.py). Functions building new :class:`~.state.Assignments`;
synchronous, under the server's lock.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from . import planning, replanning
from .balloon import Balloon, ContainerKey
from .config import DEFAULT, BalloonsConfig, BalloonType
from .planning import Restored
from .state import Assignments
from .topology import Topology, format_cpuset

log = logging.getLogger("hooks.balloons")


def rebuild(
    config: BalloonsConfig, topology: Topology, found: Iterable[Restored],
    reserved: frozenset[int] | None = None, empty: Iterable[Balloon] = (), rehome: bool = True,
) -> Assignments:
    """Assignments for containers that already run: each rejoins a balloon of its
    type made of the CPUs it runs on; containers not pinned yet are placed anew.
    ``reserved``: the reserved CPUs before a re-plan (hotplug, a reload), kept
    where still online when the config gives a quantity, as balloons keep
    theirs; None at start-up: those the reserved type's containers run on.
    ``empty``: a re-plan's empty balloons, kept too (Pool.add_min_balloons).
    ``rehome`` False: a re-plan's container in the default balloon, its
    type having had no room for it, stays there (see replan)."""
    found = list(found)
    # Only the CPUs online now: a container on a CPU gone offline (hotplug)
    # keeps the rest of its balloon; applied (below) keeps what it was given.
    online = {item.member.key: item.cpus & topology.all_cpus for item in found}
    keep, avoid = planning.reserved_to_keep(
        config, topology, ((item.pod, online[item.member.key]) for item in found), reserved
    )
    # The minBalloons balloons come after the containers are restored: made
    # first, they could hold CPUs containers run on, take them in and merge
    # pods, or use up maxBalloons (the containers then placed anew).
    state = Assignments(config, topology, keep, avoid, min_balloons=False)
    pool = state.pool
    # Those staying in a balloon of their type with own CPUs left go first:
    # one whose type a reload changed, or whose balloon lost all its CPUs
    # (reserved now, offline), made a balloon first (of the CPUs it runs
    # on, or of none), maybe the last maxBalloons allows, and those of
    # balloons with CPUs left, put back after it, were placed anew.
    found.sort(key=lambda item: item.order(config, pool.available - pool.reserved))
    fresh: list[tuple[Restored, BalloonType]] = []
    fallbacks: list[tuple[ContainerKey, BalloonType]] = []
    # Not the astray's (below): what they run on says nothing of the idle CPUs balloons share.
    shared = planning.shared_cpus(online[item.member.key] for item in found if not item.astray)
    mates = planning.balloon_mates(found)
    for item in found:
        key = item.member.key
        cpus = online[key]
        if item.answers:
            state.answers[key] = item.answers
        btype, unknown = planning.type_or_default(config, item.pod)
        if unknown is not None:
            log.warning("%s; placing %s in the default balloon", unknown, item.member.label)
        pinned = bool(cpus) and cpus != topology.all_cpus and cpus <= pool.available
        back = item.planned is not None and btype.name in (item.planned.btype, item.fallback)
        if back and item.planned and item.planned.btype != btype.name:
            # The default one, its type could not take it (see rehome), pinned
            # too: taken for its type's, it took a balloon, or a maxBalloons
            # place, from that type's containers restored after it.
            fallbacks.append((key, btype))
            btype = pool.types[DEFAULT]
        if back and item.planned and (item.astray or not pinned):
            # Its balloon's CPUs still there: not pinned, or astray, what it
            # still runs on not its balloon's (a move refused): taken for
            # them, they joined its balloon, which shrank to its requests
            # keeping some of them, moving its other containers, or, as a
            # restart guesses, they regrouped pods.
            cpus = item.planned.own_cpus & pool.available
        elif pinned and not item.astray:
            # Its balloon's own CPUs, if a re-plan's, within what it runs on
            # and not reserved now (a reload raising the reserved CPUs, or
            # hotplug topping them up: restore() takes those out, and the
            # balloon, left with none, took any free CPU, maybe a
            # neighbour's idle one); else those it shares with no other
            # cpuset (shared_cpus). Its own CPUs all offline, that may
            # claim an idle CPU it shared with another balloon, moving
            # that balloon's containers (hotplug); placed anew it moved
            # more.
            own = item.planned.own_cpus & (cpus - pool.reserved) if back and item.planned else frozenset()
            cpus = own or cpus - shared
        else:  # placed anew, below (astray, its type changed: nor are the CPUs it runs on a balloon's)
            cpus = frozenset()
        # Back with no own CPU left, it rejoins only its balloon's mates (else placed anew, maybe moved).
        them = mates.get(item.planned.name, frozenset()) if back and item.planned else None
        index = item.planned.index if back and item.planned and item.planned.btype == btype.name else None
        balloon = pool.restore(item.member, btype, cpus, them, index) if cpus or them is not None else None
        if balloon is None:  # not pinned, or its type has no room left
            fresh.append((item, btype))
            continue
        state.record_placed(item)
        where = f"it runs on cpus {format_cpuset(item.cpus)}" if pinned and not item.astray else (
            f"its balloon had cpus {format_cpuset(item.planned.own_cpus if item.planned else frozenset())}"
            + ("; its move there was refused or may not have been applied" if item.astray else "")
        )
        log.info("restoring container %s to balloon %s (%s)", item.member.label, balloon.name, where,
                 extra={"container": item.member.label, "balloon": balloon.name})
    pool.add_min_balloons(frozenset().union(*(c for c in online.values() if c != topology.all_cpus)), empty)
    for problem in pool.settle():
        log.warning("balloon cannot be sized after rebuild: %s", problem)
    for key, btype in fallbacks if rehome else ():
        if pool.balloon_of(key) is not None and pool.rehome(key, btype).btype is btype:
            label = pool.balloon_of(key).members[key].label  # type: ignore[union-attr]  # rehomed: in a balloon
            log.info("moving container %s from the default balloon to balloon %s: its type has room for it now",
                     label, pool.balloon_of(key).name, extra={"container": label})  # type: ignore[union-attr]  # (as above)
    pool.grow_short(empty=False)  # empty balloons grow once running containers have their CPUs, below
    for item, btype in fresh:
        # A container that already runs cannot be refused, whatever
        # onExhausted says: if its type is exhausted it joins a balloon of
        # its type as it can, or goes to the default balloon.
        balloon = pool.assign_anyway(item.member, btype)
        state.record_placed(item)
        log.info(
            "assigning running container %s to balloon %s",
            item.member.label,
            pool.describe(balloon),
            extra={"container": item.member.label, "balloon": balloon.name},
        )
    pool.grow_short()
    return state


def replan(state: Assignments, config: BalloonsConfig, topology: Topology) -> Assignments:
    """``state``'s containers, as they run now, on another config (a reload) or
    machine (hotplug): rebuilt, the reserved CPUs kept (see rebuild). PoolError.
    The balloons keep their names and order (placement tries them in it).
    A container in the default balloon because its type had no room for
    it goes into a balloon of its type only if the config changed:
    placement leaves it there while it runs, whatever CPUs are freed, and
    so does a reload of the same config, or hotplug."""
    empty = [b for b in state.pool.balloons if not b.members and not b.fixed]
    again = rebuild(config, topology, replanning.restored(state), state.pool.reserved, empty,
                    rehome=not config.plans_as(state.config))
    replanning.keep_order(state.pool.balloons, again.pool.balloons)
    return again
