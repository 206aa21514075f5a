"""A restart after test_churn_split_pods' workloads (seeds 0-499), its
containers found on what they were given: test_restart_random's
check_balloons holds (no CPU in two balloons, none short beside free CPUs,
none in the default balloon while an empty one of its type could take
it), and pods are regrouped only where the state before had a pod split
over balloons of its type or a container its type could not take in the
default balloon (a fallback). A restart rebuilds the balloons from the
cpusets alone (docs/hook-balloons.md, Restarts): a container rejoins its
pod's balloon when that has room for it, and a fallback's CPUs cannot be
told from a balloon of its type's, so it makes one of them when its type
has room (its pod's containers may then follow it). Here 96 restarts of
500 regroup, every one after a split pod or a fallback; none of the 141
without either does (balloons short of CPUs or not: 36 of the 96 had none
short). With stateDir set, the balloons saved (savedplan.py) and agreeing
with what runs, none of the 500 regroups: each balloon comes back with its
name, CPUs and containers, and no container moves.
"""

from __future__ import annotations

from collections import defaultdict

from hooks.balloons import restoring
from hooks.balloons.config import DEFAULT, parse_config
from hooks.balloons.savedplan import rebuild_from, snapshot

from .test_churn_split_pods import SEEDS, run
from .test_restart_random import check_balloons, found, groups, unpinned

# Of the 500 workloads, those where the restart finds a container on every
# CPU, and how many of them a rebuild from the cpusets regroups.
RUNS_ON_EVERY_CPU, FELL_BACK_REGROUPED = 366, 102


def test_a_restart_regroups_pods_only_where_a_pod_was_split_or_a_container_fell_back() -> None:
    problems: dict[str, list[int]] = defaultdict(list)
    regrouped = kept_whole = 0
    for seed in SEEDS:
        _, _, made = run(seed)
        if made is None:
            continue
        doc, topology, state = made
        again = restoring.rebuild(parse_config(doc), topology, found(state), None)
        check_balloons(seed, again, problems)
        fallbacks = any(b.members for b in state.pool.of_type(DEFAULT))
        split = any(
            len([b for b in state.pool.of_type("work") if b.has_pod(uid)]) > 1
            for uid in {m.pod_uid for _, m in state.pool.members()}
        )
        if groups(again, frozenset()) != groups(state, frozenset()):
            regrouped += 1
            if not (fallbacks or split):
                problems["pods regrouped, none split nor fallen back"].append(seed)
        elif not (fallbacks or split):
            kept_whole += 1
    assert dict(problems) == {}
    assert regrouped > 50 and kept_whole > 100, (regrouped, kept_whole)  # both cases met


def test_a_restart_with_the_saved_balloons_regroups_no_pod() -> None:
    """stateDir set: the balloons saved at the end of each workload, read
    back as the restart finds its containers (before: rebuilt from the
    cpusets, 96 of these regrouped, the test above)."""
    problems: dict[str, list[int]] = defaultdict(list)
    runs = 0
    for seed in SEEDS:
        _, _, made = run(seed)
        if made is None:
            continue
        doc, topology, state = made
        again = rebuild_from(parse_config(doc), topology, found(state), snapshot(state)).state
        runs += 1
        check_balloons(seed, again, problems)
        if [(b.name, b.cpus, sorted(b.members)) for b in again.pool.balloons] != \
                [(b.name, b.cpus, sorted(b.members)) for b in state.pool.balloons]:
            problems["balloons changed"].append(seed)
        if again.moves():
            problems["moves"].append(seed)
    assert dict(problems) == {}
    assert runs == 500


def test_a_restart_with_the_saved_balloons_puts_back_containers_found_on_every_cpu() -> None:
    """stateDir set, about one container in five found on every CPU
    (restarted by kubelet while the hook was down): the saved balloons are
    used all the same, those containers put back in their balloon and
    moved, no other (before: these restarts did not agree with the saved
    balloons and rebuilt from the cpusets, which regroups pods in FELL_BACK_REGROUPED)."""
    problems: dict[str, list[int]] = defaultdict(list)
    runs = regrouped_without = 0
    for seed in SEEDS:
        _, _, made = run(seed)
        if made is None:
            continue
        doc, topology, state = made
        fresh = unpinned(seed, state)
        if not fresh:
            continue
        config = parse_config(doc)
        restart = rebuild_from(config, topology, found(state, fresh), snapshot(state))
        runs += 1
        check_balloons(seed, restart.state, problems)
        if [(b.name, b.cpus, sorted(b.members)) for b in restart.state.pool.balloons] != \
                [(b.name, b.cpus, sorted(b.members)) for b in state.pool.balloons]:
            problems["balloons changed"].append(seed)
        if not {move.key for move in restart.state.moves()} <= fresh:
            problems["moves of containers on their balloon's cpuset"].append(seed)
        cpusets = restoring.rebuild(config, topology, found(state, fresh), None)
        regrouped_without += groups(cpusets, fresh) != groups(state, fresh)
    assert dict(problems) == {}
    assert (runs, regrouped_without) == (RUNS_ON_EVERY_CPU, FELL_BACK_REGROUPED)
