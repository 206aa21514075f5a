"""Reloads of the same config between which containers come and go, on
random workloads (seeds 0-1999, a failure names its seed and reload),
straight and after a restart that found about one container in five on
every CPU and whose moves of these the runtime refused; about one workload
in three under ``onExhausted: Ignore``, where containers a type cannot take
run short of CPUs or in the default balloon. Each reload keeps what
docs/hook-balloons.md promises of a reload of the same config:

* it changes no balloon (each keeps its name, place in the pool's order,
  CPUs and containers) and moves no container, but one whose move is
  still due (after the restart, those whose move was refused), to where
  it was due to go;
* each CPU is in one balloon at most, and no balloon with containers is
  short of CPUs while some are free.

So a container in the default balloon, its type having had no room for
it, stays there, as placement leaves it while it runs, even beside a
balloon of its type that could take it now (fixed cases below, from
seeds past 1999).

The only moves refused here are those of the containers a restart found on
every CPU: no pinned container's move is ever refused, so a container
astray (running on CPUs not its balloon's) is checked by
test_reload_changed_config's checker, which refuses two moves in five.

The same-config checker (test_reload_same_config) reloads once, after the
workload; here containers are released and added between reloads, so
that balloons emptied, shrunk or regrown by placement are re-planned.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Set

import pytest

from hooks.balloons import restoring
from hooks.balloons.config import PodContext, parse_config
from hooks.balloons.pool import PoolError
from hooks.balloons.state import Assignments
from hooks.balloons.topology import Topology, format_cpuset

from .test_reload_same_config import named_layout
from .test_restart_random import add_or_release, balloon_type, found, unpinned

BLOCKS = [range(start, start + 250) for start in range(0, 2000, 250)]
Key = tuple[str, str]


def churn(state: Assignments, live: dict[Key, PodContext], r: random.Random, step: int) -> None:
    """One to six containers released or added, every move done."""
    for n in range(r.randint(1, 6)):
        add_or_release(state, live, r, release_odds=0.45, pods=8, id_suffix=f"{step}-{n}")
    settle_moves(state)


def settle_moves(state: Assignments, refused: Set[Key] = frozenset()) -> None:
    """Every move done, but those of ``refused`` containers, which the runtime refuses."""
    for move in state.moves():
        (state.not_moved if move.key in refused else state.moved)(move)
    for _, member in state.pool.members():
        if member.key not in state.applied and member.key not in refused:
            state.given(member.key, state.target(member.key))


def start(seed: int) -> tuple[dict, Topology, Assignments, random.Random] | None:
    """A config, a machine, their empty plan and the random source of the
    workload's changes; None if the config does not fit the machine."""
    r = random.Random(seed * 31 + 7)
    topology = Topology.synthetic(r.choice([1, 2]), r.choice([1, 2]), r.choice([2, 3, 4, 6]), r.choice([1, 2]))
    types = [balloon_type(r, "work", "*")]
    if r.random() < 0.4:
        types.insert(0, balloon_type(r, "batch", "batch"))
    if r.random() < 0.3:
        types.append({"name": "reserved", "shareIdleCPUsInSame": "system"})
    doc: dict = {"reservedResources": {"cpu": str(r.randint(1, 2))}, "balloonTypes": types}
    if r.random() < 0.35:
        doc["onExhausted"] = "Ignore"
    try:
        return doc, topology, Assignments(parse_config(doc), topology), r
    except PoolError:
        return None


def problems_of(before: Assignments, after: Assignments, due: Set[Key]) -> list[str]:
    """What ``after``, a reload of ``before``'s config, breaks of the promises above."""
    problems = []
    if named_layout(after) != named_layout(before):
        problems.append(f"balloons changed: {named_layout(before)} -> {named_layout(after)}")
    for _, member in before.pool.members():  # those due too: to where they were due to go
        if before.target(member.key) != after.target(member.key):
            problems.append(f"{member.label} given {after.target(member.key)} for {before.target(member.key)}")
    if moves := sorted(m.key for m in after.moves() if m.key not in due):
        problems.append(f"moves {moves}")
    owned: set[int] = set()
    pool = after.pool
    for balloon in pool.balloons:
        if balloon.cpus & owned:
            problems.append(f"CPUs {format_cpuset(balloon.cpus & owned)} in two balloons")
        owned |= balloon.cpus
        if pool.free and balloon.members and not balloon.fixed and len(balloon.cpus) < balloon.target_size():
            problems.append(f"{balloon.name} short of CPUs beside free ones")
    return problems


def run(seed: int, restart: bool) -> Iterator[tuple[str, list[str]]]:
    """Each reload of the workload of ``seed`` and what it broke."""
    made = start(seed)
    if made is None:
        return
    doc, topology, state, r = made
    live: dict[Key, PodContext] = {}
    churn(state, live, r, 0)
    refused: set[Key] = set()
    if restart:
        refused = unpinned(seed, state)
        state = restoring.rebuild(parse_config(doc), topology, found(state, refused), None)
        settle_moves(state, refused)
        refused &= {m.key for m in state.moves()}  # still due: placed anew off their CPUs
    for reload in range(1, 4):
        again = restoring.replan(state, parse_config(doc), topology)
        yield f"reload {reload}", problems_of(state, again, refused)
        state = again
        settle_moves(state)
        refused = set()
        churn(state, live, r, reload)


def failures(seeds: range, restart: bool) -> tuple[dict[str, list[str]], int]:
    problems: dict[str, list[str]] = {}
    runs = 0
    for seed in seeds:
        for what, found_problems in run(seed, restart):
            runs += 1
            if found_problems:
                problems[f"{seed} {what}"] = found_problems
    return problems, runs


@pytest.mark.parametrize("seeds", BLOCKS, ids=lambda b: f"{b.start}-{b.stop - 1}")
@pytest.mark.parametrize("restart", [False, True], ids=["straight", "restart"])
def test_reloads_of_the_same_config_between_containers_coming_and_going_change_nothing(seeds: range, restart: bool) -> None:
    problems, runs = failures(seeds, restart)
    assert problems == {}
    assert runs > 600, runs


@pytest.mark.parametrize("seed", [111, 845, 1665])
@pytest.mark.parametrize("restart", [False, True], ids=["straight", "restart"])
def test_a_container_in_the_default_balloon_stays_there_at_a_reload_of_the_same_config(seed: int, restart: bool) -> None:
    """Seed 111: apps/p5/c1, in the default balloon on 4-5 (its pod's
    balloon of work, at maxCPUs, could not take it), was moved by the
    reload into that balloon, grown to 1-3 once another container had left
    it, moving its two others too; 845: into a balloon of work made of its
    CPUs, work sharing the idle CPUs of its NUMA node, 6-7 to 6-11; 1665:
    it went from the default balloon to batch's, on the same CPUs."""
    assert dict(run(seed, restart)) == {"reload 1": [], "reload 2": [], "reload 3": []}


@pytest.mark.parametrize(("seed", "restart"), [
    (5722, False), (5722, True), (7332, False), (7332, True), (9508, False), (9508, True), (11388, False)])
def test_a_container_in_the_default_balloon_stays_there_beside_a_balloon_of_its_type_with_room(seed: int, restart: bool) -> None:
    """Seed 5722, reload 2: batch/p7/c1, in the default balloon on 2, joined
    its pod's balloon work[0], and work[1], holding apps/p3/c1 on no CPU of
    its own, took 2: both moved; 7332, reload 3: batch/p4/c1 joined
    work[1], grown from 2-3 to 1-3, moving its container too; 9508, reload
    3: apps/p3/c0 went into the empty work[0], on 1,25; 11388, reload 1
    (not after a restart): apps/p4/c0 into the empty work[1], given 3."""
    assert dict(run(seed, restart)) == {"reload 1": [], "reload 2": [], "reload 3": []}
