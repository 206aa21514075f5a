"""A restart, and a reload that adds minBalloons, on random workloads with
fixed seeds (a failure names its seed): after the rebuild each CPU is in at
most one balloon, the reserved CPUs are those before, pods that shared a
balloon share one and no others do, and, after a restart, no container moves.

Except on a type sharing idle CPUs in its NUMA node: a balloon whose
containers all run on one cpuset, its CPUs and the node's idle ones, does not
tell which are its own; settle() keeps the most compact part, which may move
it and the balloons sharing the rest.
"""

from __future__ import annotations

import random

from hooks.balloons.config import BalloonsConfig, PodContext, parse_config
from hooks.balloons.pool import Exhausted, Member, PoolError
from hooks.balloons.state import Assignments, Restored
from hooks.balloons.topology import Topology, parse_cpuset

SEEDS = range(600)


def workload(seed: int) -> tuple[dict, Topology, Assignments] | None:
    """A config, a machine and the state some containers coming and going left,
    every move done; None if the config does not fit the machine."""
    r = random.Random(seed)
    topology = Topology.synthetic(1, r.choice([1, 2]), r.choice([4, 6]), r.choice([1, 2]))
    work: dict = {"name": "work", "namespaces": ["*"]}
    if r.random() < 0.6:
        work["preferNewBalloons"] = True
    if r.random() < 0.5:
        work["maxBalloons"] = r.randint(1, 3)
    if r.random() < 0.3:
        work.update(minBalloons=1, minCPUs=r.randint(0, 2))
    if r.random() < 0.3:
        work["maxCPUs"] = r.randint(2, 4)
    if r.random() < 0.3:
        work["shareIdleCPUsInSame"] = r.choice(["system", "numa"])
    types = [work]
    if r.random() < 0.3:
        types.append({"name": "reserved", "shareIdleCPUsInSame": "system"})
    doc = {"reservedResources": {"cpu": str(r.randint(1, 2))}, "balloonTypes": types}
    try:
        state = Assignments(parse_config(doc), topology)
    except PoolError:
        return None
    live: dict[tuple[str, str], PodContext] = {}
    for step in range(r.randint(1, 12)):
        if live and r.random() < 0.35:
            key = r.choice(sorted(live))
            state.release(key)
            del live[key]
        else:
            uid, name = f"p{r.randint(0, 6)}", f"c{r.randint(0, 1)}"
            if (uid, name) in live:
                continue
            ns = "kube-system" if r.random() < 0.25 else "apps"
            ns = next((pod.namespace for key, pod in live.items() if key[0] == uid), ns)  # one pod, one namespace
            milli = r.choice([0, 500, 1000, 1500, 2000])
            try:
                state.place(Member((uid, name), ns, uid, milli, f"id-{uid}-{name}-{step}"), PodContext(ns, uid, name))
            except Exhausted:
                continue
            live[(uid, name)] = PodContext(ns, uid, name)
        for move in state.moves():
            state.moved(move)
        for _, member in state.pool.members():
            if member.key not in state.applied:
                state.given(member.key, state.target(member.key))
    return doc, topology, state


def found(state: Assignments) -> list[Restored]:
    """The containers as the runtime lists them after a restart: on what they were given."""
    out = []
    for _, m in state.pool.members():
        cpus, mems = state.applied[m.key]
        out.append(Restored(Member(m.key, m.namespace, m.pod_name, m.milli, m.container_id), state.pods[m.key],
                            parse_cpuset(cpus), mems))
    return out


def groups(state: Assignments) -> list[tuple[str, list[str]]]:
    return sorted((b.btype.name, sorted({m.pod_uid for m in b.members.values()})) for b in state.pool.balloons if b.members)


def check(seed: int, before: Assignments, after: Assignments, problems: dict[str, list[int]]) -> None:
    owned: set[int] = set()
    for balloon in after.pool.balloons:
        if balloon.cpus & owned:
            problems["a CPU in two balloons"].append(seed)
        owned |= balloon.cpus
    if after.pool.reserved != before.pool.reserved:
        problems["reserved CPUs changed"].append(seed)
    if groups(after) != groups(before):
        problems["pods regrouped"].append(seed)


def numa_sharing(config: BalloonsConfig, topology: Topology) -> bool:
    return len(topology.node_cpus) > 1 and any(
        t.share_idle_cpus_in_same == "numa" for t in config.balloon_types if t.name != "reserved"
    )


KINDS = ("a CPU in two balloons", "reserved CPUs changed", "pods regrouped", "moves")


def test_a_restart_keeps_the_reserved_cpus_and_the_balloons_and_moves_nothing() -> None:
    problems: dict[str, list[int]] = {kind: [] for kind in KINDS}
    runs = ambiguous = 0
    for seed in SEEDS:
        made = workload(seed)
        if made is None:
            continue
        doc, topology, state = made
        config = parse_config(doc)
        again = Assignments.rebuild(config, topology, found(state), None)
        check(seed, state, again, problems)
        runs += 1
        if numa_sharing(config, topology):
            ambiguous += bool(again.moves())
        elif again.moves():
            problems["moves"].append(seed)
    assert problems == {kind: [] for kind in KINDS}
    assert runs > 500 and ambiguous <= 2


def test_a_reload_adding_a_min_balloon_keeps_the_reserved_cpus_and_the_pods_apart() -> None:
    """Made before the containers were restored, a balloon of 2 CPUs held
    CPUs of two preferNewBalloons pods, which it then merged."""
    problems: dict[str, list[int]] = {kind: [] for kind in KINDS}
    runs = 0
    for seed in SEEDS:
        made = workload(seed)
        if made is None:
            continue
        doc, topology, state = made
        work = doc["balloonTypes"][0]
        work.update(minBalloons=max(work.get("minBalloons", 0), 1), minCPUs=2)
        try:
            again = state.replan(parse_config(doc), topology)
        except PoolError:
            continue
        check(seed, state, again, problems)
        runs += 1
    assert problems == {kind: [] for kind in KINDS}
    assert runs > 400
