"""A reload of the same config changes no balloon and moves no pinned
container: an operator who touches the config file must not see workloads
migrate between CPUs, nor the runtime be asked to give a container the
cpuset it has. On the random workloads of test_restart_random (seeds 0-1999:
a failure names its seed), straight, and after a restart that found about
one container in five on every CPU (not pinned yet, as in kubelet's shared
pool) and whose moves of these the runtime refused.

Unlike a restart, a reload knows each balloon's own CPUs: the ambiguity of
shareIdleCPUsInSame at package, NUMA node or core scope (test_restart_random)
does not arise. The one exclusion: the containers on every CPU whose move
was refused are moved again, as they were due to be, to where they were to
go before the reload.
"""

from __future__ import annotations

import logging
from collections.abc import Set
from pathlib import Path
from typing import Any

import yaml

from hooks.balloons import restoring
from hooks.balloons.balloon import Member
from hooks.balloons.config import PodContext, parse_config
from hooks.balloons.planning import Restored
from hooks.balloons.server import BalloonsHook
from hooks.balloons.state import Assignments
from hooks.balloons.topology import Topology, format_cpuset

from .test_hotplug import hook_on_sysfs
from .test_replan import balloons, placed, pods_a_and_b_in_new_balloons
from .test_restart_random import found, unpinned, workload, workloads
from .test_server import request

SEEDS = range(2000)


def moved(before: Assignments, after: Assignments, leave_out: Set[tuple[str, str]] = frozenset()) -> list[tuple[str, str]]:
    """The containers, but those in ``leave_out``, that ``after`` gives
    another cpuset than ``before`` did, or moves at all."""
    changed = {m.key for _, m in before.pool.members() if before.target(m.key) != after.target(m.key)}
    return sorted((changed | {move.key for move in after.moves()}) - leave_out)


def layout(state: Assignments) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """Each balloon's type, own CPUs and containers."""
    return sorted((b.btype.name, format_cpuset(b.cpus), sorted(b.members)) for b in state.pool.balloons)


def named_layout(state: Assignments) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """Each balloon's name (in logs and the status), own CPUs and
    containers, in the pool's order (placement tries balloons in it)."""
    return [(b.name, format_cpuset(b.cpus), sorted(b.members)) for b in state.pool.balloons]


def test_a_reload_of_the_same_config_moves_no_pinned_container_and_keeps_every_balloon() -> None:
    """Every balloon keeps its name too, and its place in the pool's order
    (over seeds 0-1999, before, 272 runs renamed or reordered balloons, as
    seed 10's work[3] made again as work[0]: the first index free). Over
    seeds 0-599, before, 19 of these runs moved containers (over 0-1999: 66): those their balloon gave every CPU (a reserved type sharing
    every idle CPU), taken for not pinned and recorded on nothing, were
    given it again (14; 50); sharing idle CPUs in a package, NUMA node or
    core, a balloon kept the most compact part of its containers' cpuset, as
    a restart does, not the CPUs it had (5; 16). An empty minBalloons
    balloon was made anew, on other CPUs in 10 runs over seeds 0-1999 (seed
    339: work[1] from CPU 2 to 1), changing the idle CPUs containers share
    (seed 690: the reserved balloon's)."""
    problems: dict[int, list[tuple[str, str]]] = {}
    changed: list[int] = []
    runs = 0
    for seed, doc, topology, state in workloads(seeds=SEEDS):
        again = restoring.replan(state, parse_config(doc), topology)
        runs += 1
        if moves := moved(state, again):
            problems[seed] = moves
        if named_layout(again) != named_layout(state):
            changed.append(seed)
    assert (problems, changed) == ({}, [])
    assert runs > 1900


def test_a_reload_after_a_restart_moves_no_pinned_container_and_keeps_every_balloon() -> None:
    """Over seeds 0-599, before, 13 of these runs moved a pinned container
    (over 0-1999: 41), each one its balloon gave every CPU, as in the test
    above. The containers on every CPU whose move was refused are moved
    again, and only they, to the cpuset they were to get: an empty
    minBalloons balloon made anew on other CPUs changed it in seed 1469 (see
    the test below), and only that balloon's CPUs in 1884 and 1913."""
    changed: list[int] = []
    problems: dict[int, list[tuple[str, str]]] = {}
    retargeted: list[int] = []
    undue: dict[int, tuple[list[tuple[str, str]], list[tuple[str, str]]]] = {}
    runs = due = 0
    for seed, doc, topology, state in workloads(seeds=SEEDS):
        config = parse_config(doc)
        fresh = unpinned(seed, state)
        restarted = restoring.rebuild(config, topology, found(state, fresh), None)
        refused: set[tuple[str, str]] = set()
        for move in restarted.moves():
            if move.key in fresh:
                restarted.not_moved(move)
                refused.add(move.key)
            else:
                restarted.moved(move)
        again = restoring.replan(restarted, config, topology)
        runs += 1
        # Moved again: exactly those whose move was refused, still due.
        if (again_moved := moved(restarted, again, set(state.applied) - fresh)) != sorted(refused):
            undue[seed] = (again_moved, sorted(refused))
        due += bool(refused)
        if any(restarted.target(key) != again.target(key) for key in fresh):
            retargeted.append(seed)
        if moves := moved(restarted, again, fresh):
            problems[seed] = moves
        if named_layout(again) != named_layout(restarted):
            changed.append(seed)
    assert (problems, retargeted, changed, undue) == ({}, [], [], {})
    # Runs with a move refused, for the check above to check (228 of 582 over seeds 0-599 when written).
    assert runs > 1900 and due > 400, due


def test_an_empty_min_balloon_keeps_its_cpus_at_a_reload_and_those_sharing_idle_cpus_their_cpuset() -> None:
    """Seed 1469: 12 CPUs, 0 and 6 reserved, where kube-system's p5/c0,
    found on every CPU after a restart and refused its move, is to go with
    the idle CPUs (the reserved type shares them). batch's two empty
    minBalloons balloons hold CPUs 1 and 7: made anew at the reload, they
    took 8 and 1, and p5/c0's cpuset to be became 0,3-7,9-11."""
    made = workload(1469)
    assert made is not None
    doc, topology, state = made
    config = parse_config(doc)
    fresh = unpinned(1469, state)
    assert ("p5", "c0") in fresh
    restarted = restoring.rebuild(config, topology, found(state, fresh), None)
    for move in restarted.moves():
        (restarted.not_moved if move.key in fresh else restarted.moved)(move)
    batch = [("batch[0]", "1"), ("batch[1]", "7")]
    assert [(b.name, format_cpuset(b.cpus)) for b in restarted.pool.of_type("batch")] == batch
    assert restarted.target(("p5", "c0"))[0] == "0,3-6,8-11"
    again = restoring.replan(restarted, config, topology)
    assert [(b.name, format_cpuset(b.cpus)) for b in again.pool.of_type("batch")] == batch
    assert again.target(("p5", "c0")) == restarted.target(("p5", "c0"))


def test_a_balloon_whose_own_cpu_a_reload_reserves_takes_no_other_balloons_idle_cpu() -> None:
    """Seed 778: 12 CPUs, CPU 0 reserved; work's p0/c0 shares every idle CPU
    (2-11) with its own CPU 6, batch's p6/c1 its core's idle CPU 7 with its
    own CPU 1. Reserving two CPUs reserves 6: work's own CPU, still within
    what p0/c0 runs on, was given back, taken out as reserved, and work,
    left with none, took idle CPU 7, moving p6/c1 from 1,7 to 1."""
    made = workload(778)
    assert made is not None
    doc, topology, state = made
    batch = ("p6", "c1")
    assert state.target(batch)[0] == "1,7"
    again = restoring.replan(state, parse_config({**doc, "reservedResources": {"cpu": "2"}}), topology)
    assert again.pool.reserved == {0, 6}
    assert again.target(batch) == state.target(batch)
    assert moved(state, again) == [("p0", "c0")]  # off CPU 6, reserved now


async def reloaded(hook: BalloonsHook, tmp_path: Path, config: dict[str, Any]) -> None:
    """``hook`` reloads ``config`` from its file, its moves done."""
    path = tmp_path / "balloons.yaml"
    path.write_text(yaml.safe_dump(config))
    assert await hook.reload(path)
    assert await hook.apply_moves()


async def test_a_container_given_every_cpu_is_not_moved_by_a_reload(tmp_path) -> None:
    """kube-system's k runs on the reserved CPU and every idle one, 0-7: taken
    for not pinned at the reload, it was given 0-7 again."""
    config = {"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "reserved", "shareIdleCPUsInSame": "system"}]}
    hook, runtime, _ = await hook_on_sysfs(tmp_path, config)
    answer = await hook.pre_create_container(request("k", "dns", ns="kube-system"))
    assert answer.container_resources.cpuset_cpus == "0-7"
    await hook.pre_start_container(request("k", "dns", ns="kube-system", cid="c-k"))
    assert await hook.apply_moves()
    await reloaded(hook, tmp_path, config)
    assert runtime.updates == []


async def test_a_balloon_sharing_idle_cpus_in_its_numa_node_keeps_its_own_cpus_at_a_reload(tmp_path) -> None:
    """CPUs 0-1 on node 0, 2-3 on node 1. Pod a's balloon holds 1 and 2, and
    runs on 1-3 with node 1's idle 3: taken for its own, 1-3 shrank to their
    most compact part, 2-3, and a moved off node 0."""
    config = {"reservedResources": {"cpu": "cpuset:0"},
              "balloonTypes": [{"name": "work", "namespaces": ["*"], "shareIdleCPUsInSame": "numa"}]}
    hook, runtime, _ = await hook_on_sysfs(tmp_path, config, Topology.synthetic(2, 1, 2, 1))
    for name in ("app", "side"):
        await hook.pre_create_container(request("a", name, shares=1024))
        await hook.pre_start_container(request("a", name, cid=f"c-{name}"))
    assert await hook.apply_moves()
    assert balloons(hook) == [("reserved[0]", "0", []), ("work[0]", "1-2", ["c-app", "c-side"])]
    assert hook.status()["balloons"][1]["effective_cpus"] == "1-3"
    updates = list(runtime.updates)
    await reloaded(hook, tmp_path, config)
    assert runtime.updates == updates
    assert balloons(hook) == [("reserved[0]", "0", []), ("work[0]", "1-2", ["c-app", "c-side"])]


def test_a_container_its_type_had_no_room_for_stays_in_the_default_balloon_at_a_reload() -> None:
    """Under Ignore, work (maxBalloons 1, maxCPUs 2) held a's balloon, and b
    (2 CPUs), which it could not take, went to the default balloon, before
    c's balloon of work, a gone. Put back first, b was taken for a container
    of work running on its CPUs and made work's one balloon of them; c, left
    no room, went to the default balloon: the two swapped."""
    config = parse_config({"reservedResources": {"cpu": "cpuset:0"}, "onExhausted": "Ignore",
                           "balloonTypes": [{"name": "work", "namespaces": ["*"], "maxBalloons": 1, "maxCPUs": 2}]})
    topology = Topology.synthetic(1, 1, 8, 1)
    state = Assignments(config, topology)
    for uid, milli in (("a", 1500), ("b", 2000), ("c", 1500)):
        if uid == "c":
            state.release(("a", "app"))
        state.place(Member((uid, "app"), "apps", uid, milli, f"c-{uid}"), PodContext("apps", uid, "app"))
        state.given((uid, "app"), state.target((uid, "app")))
    assert [(b.name, sorted(b.members)) for b in state.pool.balloons[1:]] == [
        ("default[0]", [("b", "app")]), ("work[0]", [("c", "app")])]
    again = restoring.replan(state, config, topology)
    assert layout(again) == layout(state)
    assert again.moves() == []


def test_containers_placed_with_no_cpu_free_share_a_balloon_without_cpus_which_a_reload_keeps() -> None:
    """a's 3 CPUs fill the machine at a restart; b and c, on every CPU, find
    none free. Each took a new balloon of work without CPUs (running on the
    reserved one), which a reload then merged: b and c, on no CPU of their
    own, were put back into the first balloon without any, as restore()
    does for a type without preferNewBalloons."""
    config = parse_config({"reservedResources": {"cpu": "cpuset:0"},
                           "balloonTypes": [{"name": "work", "namespaces": ["*"]}]})
    four = Topology.synthetic(1, 1, 4, 1)
    first = Restored(Member(("a", "app"), "apps", "a", 3000, "c-a"), PodContext("apps", "a", "app"),
                     frozenset({1, 2, 3}), "0")
    state = restoring.rebuild(config, four, [first, placed("b", four.all_cpus), placed("c", four.all_cpus)])
    for move in state.moves():
        state.moved(move)
    assert layout(state) == [
        ("reserved", "0", []), ("work", "", [("b", "app"), ("c", "app")]), ("work", "1-3", [("a", "app")])]
    assert layout(restoring.replan(state, config, four)) == layout(state)


def test_a_pinned_container_in_the_default_balloon_stays_there_at_a_reload_of_the_same_config() -> None:
    """Under Ignore, work (maxBalloons 1, maxCPUs 1) held a's balloon on CPU 1,
    and b went to the default balloon, on CPU 2. a gone, work has room for
    b, but placement leaves b where it runs; a reload of the same config
    (an ignored key added) put it in a balloon of work made of its CPU 2
    (and, had work had a minBalloons balloon left empty, in that one,
    moving it: seed 111 of test_reload_churn). A changed config takes b
    into work's balloon, on its CPU."""
    doc: dict[str, Any] = {"reservedResources": {"cpu": "cpuset:0"}, "onExhausted": "Ignore",
                           "balloonTypes": [{"name": "work", "namespaces": ["*"], "maxBalloons": 1, "maxCPUs": 1}]}
    config = parse_config(doc)
    topology = Topology.synthetic(1, 1, 8, 1)
    state = Assignments(config, topology)
    for uid in "ab":
        state.place(Member((uid, "app"), "apps", uid, 1000, f"c-{uid}"), PodContext("apps", uid, "app"))
        state.given((uid, "app"), state.target((uid, "app")))
    state.release(("a", "app"))
    assert layout(state) == [("default", "2", [("b", "app")]), ("reserved", "0", [])]
    same = restoring.replan(state, parse_config({**doc, "idleCPUClass": "powersave"}), topology)
    assert (named_layout(same), same.moves()) == (named_layout(state), [])
    changed = restoring.replan(state, parse_config({**doc, "balloonTypes": [*doc["balloonTypes"], {"name": "batch", "namespaces": ["batch"]}]}), topology)
    assert changed.moves() == []
    assert layout(changed) == [("reserved", "0", []), ("work", "2", [("b", "app")])]


def test_a_balloon_keeps_its_name_at_a_reload_of_the_same_config() -> None:
    """Seed 10: work[3] is made again at the reload, as work[0] (the first
    index free), its CPUs and container the same."""
    made = workload(10)
    assert made is not None
    doc, topology, state = made
    assert named_layout(state)[1:] == [("work[3]", "6-7", [("p3", "c0")])]
    assert named_layout(restoring.replan(state, parse_config(doc), topology)) == named_layout(state)


async def test_the_status_and_logs_name_a_balloon_as_before_a_reload_of_the_same_config(tmp_path, caplog) -> None:
    """Pods a and b in balloons of their own, work[0] and work[1]; a gone,
    a reload of the same config named b's balloon work[0]."""
    hook, runtime, config = await pods_a_and_b_in_new_balloons(tmp_path)
    await hook.post_stop_container(request("a", "app", cid="c-a"))
    assert await hook.apply_moves()
    assert balloons(hook) == [("reserved[0]", "0", []), ("work[1]", "2", ["c-b"])]
    updates = list(runtime.updates)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        caplog.clear()  # only the reload's records: under --log-level=INFO a's placement in work[0] was captured
        await reloaded(hook, tmp_path, config)
    assert (balloons(hook), runtime.updates) == ([("reserved[0]", "0", []), ("work[1]", "2", ["c-b"])], updates)
    assert "to balloon work[1]" in caplog.text and "work[0]" not in caplog.text


def test_a_pod_placement_split_stays_split_at_a_reload_of_the_same_config() -> None:
    """Under Ignore, work (maxCPUs 2) holds a/c0 (1500m) in work[0]; a/c1
    (1000m), which its pod's balloon could not take, got work[1]. c0
    resized down to 500m, the two fit in one balloon: the reload put c1
    back in its pod's balloon, work[0], merging the two and moving both."""
    config = parse_config({"reservedResources": {"cpu": "cpuset:0"}, "onExhausted": "Ignore",
                           "balloonTypes": [{"name": "work", "namespaces": ["*"], "maxCPUs": 2}]})
    topology = Topology.synthetic(1, 1, 8, 1)
    state = Assignments(config, topology)
    for name, milli in (("c0", 1500), ("c1", 1000)):
        state.place(Member(("a", name), "apps", "a", milli, f"id-{name}"), PodContext("apps", "a", name))
        state.given(("a", name), state.target(("a", name)))
    assert state.resize(("a", "c0"), 500)
    for move in state.moves():
        state.moved(move)
    assert named_layout(state) == [
        ("reserved[0]", "0", []), ("work[0]", "1", [("a", "c0")]), ("work[1]", "3", [("a", "c1")])]
    again = restoring.replan(state, config, topology)
    assert (named_layout(again), again.moves()) == (named_layout(state), [])
