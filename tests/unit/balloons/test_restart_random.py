"""A restart, a reload that adds minBalloons, and CPUs going offline or
coming online (after a restart), on random workloads with fixed seeds (a
failure names its seed): each CPU is in at most one balloon, no container is
in the default balloon while an empty one of its type could take it, and,
after a restart or a reload, the reserved CPUs are those before, pods whose
pinned containers shared a balloon share one and no others do, and no pinned
container moves. Some containers are found on every CPU (not pinned yet, as
in kubelet's shared pool): placed anew, they may grow and move those sharing
their balloon (or, sharing idle CPUs, any).

Except on a type sharing idle CPUs in its package, NUMA node or core, on a
machine with more than one of these: a balloon whose containers all run on
one cpuset, its CPUs and the idle ones of its scope, does not tell which are
its own; settle() keeps the most compact part, which may move it (to another
scope's idle CPUs) and the balloons sharing the rest: 5 of the 133 such
restarts here move (numa 3, core 2).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Set

from hooks.balloons import restoring
from hooks.balloons.balloon import Member
from hooks.balloons.config import DEFAULT, BalloonsConfig, PodContext, parse_config
from hooks.balloons.planning import Restored, type_or_default
from hooks.balloons.pool import Exhausted, PoolError
from hooks.balloons.savedplan import rebuild_from, snapshot
from hooks.balloons.state import Assignments
from hooks.balloons.topology import Topology, parse_cpuset

SEEDS = range(600)


def balloon_type(r: random.Random, name: str, namespace: str) -> dict:
    btype: dict = {"name": name, "namespaces": [namespace]}
    if r.random() < 0.6:
        btype["preferNewBalloons"] = True
    if r.random() < 0.5:
        btype["maxBalloons"] = r.randint(1, 3)
    if r.random() < 0.3:
        btype.update(minBalloons=r.randint(1, 2), minCPUs=r.randint(0, 2))
        if 0 < btype.get("maxBalloons", 0) < btype["minBalloons"]:
            btype["maxBalloons"] = btype["minBalloons"]
    if r.random() < 0.3:
        btype["maxCPUs"] = r.randint(2, 4)
    if r.random() < 0.4:
        btype["shareIdleCPUsInSame"] = r.choice(["system", "package", "numa", "core"])
    return btype


def add_or_release(
    state: Assignments, live: dict[tuple[str, str], PodContext], r: random.Random,
    release_odds: float, pods: int, id_suffix: str,
) -> None:
    """One random step: a container of ``live`` released (at ``release_odds``),
    else one of pod p0..p<pods-1>'s two placed (all of a pod's in one
    namespace) and added to ``live``, its id ending in ``id_suffix``; a
    container already live, or one no balloon has room for, is left out.
    Its moves are not done."""
    if live and r.random() < release_odds:
        key = r.choice(sorted(live))
        state.release(key)
        del live[key]
        return
    uid, name = f"p{r.randint(0, pods - 1)}", f"c{r.randint(0, 1)}"
    if (uid, name) in live:
        return
    ns = r.choice(["kube-system", "apps", "apps", "batch"])
    ns = next((pod.namespace for key, pod in live.items() if key[0] == uid), ns)  # one pod, one namespace
    pod = PodContext(ns, uid, name)
    milli = r.choice([0, 500, 1000, 1500, 2000])
    try:
        state.place(Member((uid, name), ns, uid, milli, f"id-{uid}-{name}-{id_suffix}"), pod)
    except Exhausted:
        return
    live[(uid, name)] = pod


def workload(seed: int, offline: int = 0) -> tuple[dict, Topology, Assignments] | None:
    """A config, a machine and the state some containers coming and going left,
    every move done, with the ``offline`` highest CPUs offline meanwhile; None
    if the config does not fit the machine."""
    r = random.Random(seed)
    full = Topology.synthetic(r.choice([1, 2]), r.choice([1, 2]), r.choice([2, 3, 4, 6]), r.choice([1, 2]))
    topology = Topology({cpu: info for cpu, info in full.cpus.items() if cpu < len(full.cpus) - offline})
    types = [balloon_type(r, "work", "*")]
    if r.random() < 0.4:  # matched first, by namespace
        types.insert(0, balloon_type(r, "batch", "batch"))
    if r.random() < 0.3:
        types.append({"name": "reserved", "shareIdleCPUsInSame": "system"})
    doc = {"reservedResources": {"cpu": str(r.randint(1, 2))}, "balloonTypes": types}
    try:
        state = Assignments(parse_config(doc), topology)
    except PoolError:
        return None
    live: dict[tuple[str, str], PodContext] = {}
    for step in range(r.randint(1, 12)):
        add_or_release(state, live, r, release_odds=0.35, pods=7, id_suffix=str(step))
        for move in state.moves():
            state.moved(move)
        for _, member in state.pool.members():
            if member.key not in state.applied:
                state.given(member.key, state.target(member.key))
    return doc, full, state


def unpinned(seed: int, state: Assignments) -> set[tuple[str, str]]:
    """The containers found on every CPU: about one in five."""
    r = random.Random(-seed)
    return {m.key for _, m in state.pool.members() if r.random() < 0.2}


def found(state: Assignments, on_every_cpu: Set[tuple[str, str]] = frozenset()) -> list[Restored]:
    """The containers as the runtime lists them after a restart (in the
    pool's order, not the order they were created in, which ``created``
    says): on what they were given, or those ``on_every_cpu`` on every CPU."""
    out = []
    created = {key: n for n, key in enumerate(sorted(state.placed_at, key=state.placed_at.__getitem__), 1)}
    for _, m in state.pool.members():
        cpus, mems = state.applied[m.key]
        cpus = state.topology.all_cpus if m.key in on_every_cpu else parse_cpuset(cpus)
        out.append(Restored(Member(m.key, m.namespace, m.pod_name, m.milli, m.container_id), state.pods[m.key], cpus, mems,
                            created=created[m.key]))
    return out


def groups(state: Assignments, leave_out: Set[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """Each balloon's type and pods, of containers not in ``leave_out``."""
    return sorted(
        (b.btype.name, sorted({m.pod_uid for m in b.members.values() if m.key not in leave_out}))
        for b in state.pool.balloons if set(b.members) - leave_out
    )


def check(seed: int, before: Assignments, after: Assignments, problems: dict[str, list[int]],
          fresh: Set[tuple[str, str]] = frozenset()) -> None:
    if after.pool.reserved != before.pool.reserved:
        problems["reserved CPUs changed"].append(seed)
    if groups(after, fresh) != groups(before, fresh):
        problems["pods regrouped"].append(seed)
    check_balloons(seed, after, problems)


def check_balloons(seed: int, state: Assignments, problems: dict[str, list[int]]) -> None:
    """No CPU in two balloons; none in the default balloon that an empty one of
    its type could hold; no balloon short of CPUs while some are free (a
    rebuild's end needs no grow_short)."""
    owned: set[int] = set()
    for balloon in state.pool.balloons:
        if balloon.cpus & owned:
            problems["a CPU in two balloons"].append(seed)
        owned |= balloon.cpus
        if state.pool.free and balloon.members and not balloon.fixed and len(balloon.cpus) < balloon.target_size():
            problems["short beside free CPUs"].append(seed)
    for balloon in state.pool.of_type(DEFAULT):
        for key, member in balloon.members.items():
            btype, _ = type_or_default(state.config, state.pods[key])
            if any(not b.members and b.fits(member.milli) for b in state.pool.of_type(btype.name) if b is not balloon):
                problems["in default, its type's balloon empty"].append(seed)


def ambiguous(config: BalloonsConfig, topology: Topology) -> bool:
    """A type shares idle CPUs in a scope the machine has more than one of
    with more than one CPU (otherwise, as system wide or not at all)."""
    scopes = {"package": topology.package_cpus, "numa": topology.node_cpus, "core": topology.core_cpus}
    return any(
        len(scopes[t.share_idle_cpus_in_same]) > 1 and any(len(cpus) > 1 for cpus in scopes[t.share_idle_cpus_in_same].values())
        for t in config.balloon_types if t.name != "reserved" and t.share_idle_cpus_in_same in scopes
    )


def workloads(offline: int = 0, seeds: Iterable[int] = SEEDS) -> Iterator[tuple[int, dict, Topology, Assignments]]:
    """Each seed of ``seeds`` with its workload (see ``workload``), the seeds
    whose config does not fit their machine left out."""
    for seed in seeds:
        made = workload(seed, offline)
        if made is not None:
            yield seed, *made


def pinned_moves(before: Assignments, after: Assignments, fresh: set[tuple[str, str]]) -> bool:
    """Moves of pinned containers whose balloon held none placed anew
    (``fresh``) before or after, where no type shares idle CPUs (those
    placed anew take some)."""
    if any(t.share_idle_cpus_in_same for t in after.config.all_types):
        return False
    return any(
        move.key not in fresh and not (set(before.pool.balloon_of(move.key).members) | set(after.pool.balloon_of(move.key).members)) & fresh
        for move in after.moves()
    )


KINDS = ("a CPU in two balloons", "reserved CPUs changed", "pods regrouped", "in default, its type's balloon empty", "moves",
         "short beside free CPUs", "new ones placed elsewhere than at run time")


def test_a_restart_keeps_the_reserved_cpus_and_the_balloons_and_moves_nothing() -> None:
    problems: dict[str, list[int]] = {kind: [] for kind in KINDS}
    runs = moved = 0
    for seed, doc, topology, state in workloads():
        config = parse_config(doc)
        again = restoring.rebuild(config, topology, found(state), None)
        check(seed, state, again, problems)
        runs += 1
        if ambiguous(config, topology):
            moved += bool(again.moves())
        elif again.moves():
            problems["moves"].append(seed)
        fresh = unpinned(seed, state)
        again = restoring.rebuild(config, topology, found(state, fresh), None)
        check(seed, state, again, problems, fresh)
        if pinned_moves(state, again, fresh):
            problems["moves"].append(seed)
    assert problems == {kind: [] for kind in KINDS}
    assert runs > 500 and moved <= 5


def as_saved(state: Assignments) -> list[tuple[str, frozenset[int], list[tuple[str, str]]]]:
    """Each balloon's name, own CPUs and containers, in order."""
    return [(b.name, b.cpus, sorted(b.members)) for b in state.pool.balloons]


def test_a_restart_with_the_saved_balloons_keeps_them_and_puts_back_containers_found_off_them() -> None:
    """stateDir set, the balloons saved (savedplan.py): a restart finding
    every container on its balloon's cpuset gets them back as they were and
    moves nothing; one finding some on every CPU (restarted by kubelet while
    the hook was down) gets them back as well, those containers put back in
    their balloon and moved to its cpuset, none other moved (before: 228 of
    the 230 such restarts did not agree and rebuilt from the cpusets)."""
    problems: dict[str, list[int]] = {kind: [] for kind in KINDS}
    used = put_back = 0
    for seed, doc, topology, state in workloads():
        config, plan = parse_config(doc), snapshot(state)
        again = rebuild_from(config, topology, found(state), plan).state
        check(seed, state, again, problems)
        used += 1
        if again.moves():
            problems["moves"].append(seed)
        fresh = unpinned(seed, state)
        if not fresh:
            continue
        restart = rebuild_from(config, topology, found(state, fresh), plan)
        check(seed, state, restart.state, problems)
        if as_saved(restart.state) != as_saved(state):
            problems["pods regrouped"].append(seed)
        # Each moved to its balloon's cpuset, unless that is every CPU (idle ones shared system wide).
        off = {key for key in fresh if parse_cpuset(state.target(key)[0]) != topology.all_cpus}
        if {move.key for move in restart.state.moves()} != off or len(restart.put_back) != len(off):
            problems["moves"].append(seed)
        put_back += bool(off)
    assert problems == {kind: [] for kind in KINDS}
    assert used > 500 and put_back > 200, (used, put_back)


def test_a_restart_with_the_saved_balloons_places_containers_started_while_it_was_down() -> None:
    """Containers the saved balloons do not hold (started while the hook was
    down, on every CPU) are placed as new ones once the saved balloons are
    back, in the order they were created: no CPU in two balloons, the saved
    pods' groups as they were, each new one in the balloon it was placed in
    at run time (before: the saved balloons were not used: "does not hold
    container"; then, placed in the runtime's listing order, 28 of 569 in
    another balloon)."""
    problems: dict[str, list[int]] = {kind: [] for kind in KINDS}
    runs = placed = 0
    for seed, doc, topology, state in workloads():
        config, plan = parse_config(doc), snapshot(state)
        known = {m.key for _, m in state.pool.members()}
        r = random.Random(seed)
        live = dict(state.pods)
        for step in range(3):
            add_or_release(state, live, r, release_odds=0.0, pods=9, id_suffix=f"down{step}")
        new = {m.key for _, m in state.pool.members()} - known
        for key in new:
            state.given(key, state.target(key))
        restart = rebuild_from(config, topology, found(state, new), plan)
        check_balloons(seed, restart.state, problems)
        if groups(restart.state, new) != groups(state, new):
            problems["pods regrouped"].append(seed)
        if set(restart.placed) != new:
            problems["moves"].append(seed)
        # Each new one where it was placed at run time (they are placed in the order they were created).
        if any(restart.state.pool.balloon_of(key).name != state.pool.balloon_of(key).name for key in new):
            problems["new ones placed elsewhere than at run time"].append(seed)
        runs += 1
        placed += bool(new)
    assert problems == {kind: [] for kind in KINDS}
    assert runs > 500 and placed > 300, (runs, placed)


def test_a_reload_adding_a_min_balloon_keeps_the_reserved_cpus_and_the_pods_apart() -> None:
    """Made before the containers were restored, a balloon of 2 CPUs held
    CPUs of two preferNewBalloons pods, which it then merged."""
    problems: dict[str, list[int]] = {kind: [] for kind in KINDS}
    runs = 0
    for seed, doc, topology, state in workloads():
        work = next(t for t in doc["balloonTypes"] if t["name"] == "work")
        work.update(minBalloons=max(work.get("minBalloons", 0), 1), minCPUs=2)
        try:
            again = restoring.replan(state, parse_config(doc), topology)
        except PoolError:
            continue
        check(seed, state, again, problems)
        runs += 1
    assert problems == {kind: [] for kind in KINDS}
    assert runs > 400


def test_cpus_coming_online_after_a_restart_keep_the_pods_apart() -> None:
    """Found on every CPU online at the restart, a container whose move was
    refused was taken for pinned to those once more came online: its balloon
    took every free CPU, and pods sharing them joined it."""
    problems: dict[str, list[int]] = {kind: [] for kind in KINDS}
    runs = 0
    for seed, doc, topology, state in workloads(offline=2):
        config = parse_config(doc)
        fresh = unpinned(seed, state)
        restarted = restoring.rebuild(config, state.topology, found(state, fresh), None)
        for move in restarted.moves():
            (restarted.not_moved if move.key in fresh else restarted.moved)(move)
        try:
            again = restoring.replan(restarted, config, topology)
        except PoolError:
            continue
        check(seed, restarted, again, problems, fresh)
        runs += 1
        if pinned_moves(restarted, again, fresh):
            problems["moves"].append(seed)
    assert problems == {kind: [] for kind in KINDS}
    assert runs > 400


def test_cpus_going_offline_leave_no_container_in_the_default_balloon_beside_an_empty_one_of_its_type() -> None:
    """Placed anew, its CPUs gone, a container went to the default balloon
    when the balloon of its type made for minBalloons got no CPU."""
    problems: dict[str, list[int]] = {kind: [] for kind in KINDS}
    runs = 0
    for seed, doc, topology, state in workloads():
        gone = random.Random(seed).sample(sorted(topology.all_cpus), 2)
        try:
            fewer = restoring.replan(state, parse_config(doc), Topology({cpu: info for cpu, info in topology.cpus.items() if cpu not in gone}))
        except PoolError:
            continue
        check_balloons(seed, fewer, problems)
        runs += 1
    assert problems == {kind: [] for kind in KINDS}
    assert runs > 400
