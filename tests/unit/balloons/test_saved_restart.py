"""A restart with the balloons saved in stateDir that finds containers
they do not place as saved (docs/hook-balloons.md, Restarts): a saved
member off its balloon's cpuset (a move not done before the hook stopped,
or restarted by kubelet while the hook was down, on every CPU) is put back
in its saved balloon and moved, as a reload puts back one whose move was
refused; one in no saved balloon (started while the hook was down) is
placed as a new one; a saved member not found is dropped. The saved
balloons are still refused for a real disagreement (another config, a CPU
offline, other reserved CPUs). Machines as in test_hotplug: CPUs 0-3 on
NUMA node 0, 4-7 on node 1.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from hooks.balloons.balloon import Member
from hooks.balloons.config import PodContext, parse_config
from hooks.balloons.planning import Restored
from hooks.balloons.runtime import FoundContainer, Listing
from hooks.balloons.savedplan import PlanFile, SavedPlan, SavedPlanError, rebuild_from, snapshot
from hooks.balloons.savedreserved import ReservedFile
from hooks.balloons.server import BalloonsHook
from hooks.balloons.state import Assignments
from hooks.balloons.topology import Topology, format_cpuset, parse_cpuset

from .test_hotplug import balloons
from .test_replan_unpinned import TWO_NODES
from .test_replan import running
from .test_restart_random import as_saved, found, groups
from .test_saved_balloons import SPLIT, _split_pod, churned
from .test_saved_reserved import written
from .test_server import FakeRuntime, request


FOUR = Topology.synthetic(1, 1, 4, 1)


def _pinned_one(state: Assignments, running: list[Restored]) -> int:
    """The index in ``running`` of a container pinned to a cpuset short of every CPU."""
    return next(n for n, item in enumerate(running) if item.cpus and item.cpus != state.topology.all_cpus)


@pytest.mark.parametrize("change", ["a move not done", "on every CPU"])
def test_a_saved_member_off_its_balloons_cpuset_is_put_back_and_moved(change: str) -> None:
    """Before: the saved balloons were not used ("... but it runs on ...")
    and the restart rebuilt from the cpusets, which regroups this workload's pods."""
    doc, topology, state = churned()
    running = found(state)
    n = _pinned_one(state, running)
    cpus = running[n].cpus ^ {max(topology.all_cpus)} if change == "a move not done" else topology.all_cpus
    running[n] = dataclasses.replace(running[n], cpus=cpus)
    key, label = running[n].member.key, running[n].member.label
    restart = rebuild_from(parse_config(doc), topology, running, snapshot(state))
    assert as_saved(restart.state) == as_saved(state)
    assert [(move.key, move.cpuset) for move in restart.state.moves()] == [(key, state.target(key))]
    assert restart.put_back == {key: (label, state.pool.balloon_of(key).name)} and restart.placed == {}
    assert restart.summary() == "1 container(s) put back in their saved balloon; 1 to move"
    assert restart.fields() == {"put_back": [f"{label} in {state.pool.balloon_of(key).name}"], "not_put_back": [],
                                "placed": [], "moves": [label]}


def test_a_container_the_saved_balloons_do_not_hold_is_placed_as_a_new_one() -> None:
    """Started while the hook was down: placed once the saved balloons are
    back, as reconcile adopts a running container (before: "does not hold
    container", the saved balloons not used)."""
    doc, topology, state = churned()
    running = found(state)
    n = _pinned_one(state, running)
    key, label = running[n].member.key, running[n].member.label
    plan = dataclasses.replace(snapshot(state), balloons=tuple(
        dataclasses.replace(b, members=tuple(k for k in b.members if k != key)) for b in snapshot(state).balloons))
    running[n] = dataclasses.replace(running[n], cpus=topology.all_cpus)
    restart = rebuild_from(parse_config(doc), topology, running, plan)
    home = restart.state.pool.balloon_of(key)
    assert home is not None and restart.placed == {key: (label, home.name)} and restart.put_back == {}
    assert groups(restart.state, {key}) == groups(state, {key})
    assert restart.state.applied[key] == (format_cpuset(topology.all_cpus), running[n].mems)  # moved from every CPU
    assert key in {move.key for move in restart.state.moves()}


def test_a_saved_member_not_found_is_dropped() -> None:
    """Guards existing behaviour: its pod gone while the hook was down, the
    others' balloons come back as saved, without it."""
    doc, topology, state = churned()
    running = found(state)
    gone = running.pop(0).member.key
    again = rebuild_from(parse_config(doc), topology, running, snapshot(state)).state
    assert again.pool.balloon_of(gone) is None
    assert groups(again, {gone}) == groups(state, {gone}) and again.moves() == []


async def _saved_again(hook: BalloonsHook, state_dir: Path, token: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each balloon and its containers as the restarted ``hook`` saved them,
    with the token of the reserved.json it wrote (a new one: not ``token``,
    the one before the restart)."""
    await written(hook)
    plan, reserved = PlanFile(state_dir).load(), ReservedFile(state_dir).load()
    assert plan is not None and reserved is not None
    assert plan.token == reserved.token != token
    return [(b.name, list(b.members)) for b in plan.balloons]


def _offline(topology: Topology, cpu: int) -> Topology:
    return Topology({c: info for c, info in topology.cpus.items() if c != cpu})


def _other_reserved(state: Assignments, plan: SavedPlan) -> SavedPlan:
    return dataclasses.replace(plan, reserved=frozenset(state.pool.free or state.topology.all_cpus) - plan.reserved)


@pytest.mark.parametrize(("change", "why"), [
    ("config", "was saved under another config"),
    ("offline", "offline now"),
    ("reserved", "names reserved CPUs"),
], ids=["another config", "a CPU offline", "other reserved CPUs"])
def test_saved_balloons_that_no_longer_fit_are_not_used_though_a_container_is_off_them(change: str, why: str) -> None:
    """Guards existing behaviour: a container to put back does not make
    balloons that do not fit the config or the machine usable."""
    doc, topology, state = churned()
    config, running, plan = parse_config(doc), found(state), snapshot(state)
    n = _pinned_one(state, running)
    running[n] = dataclasses.replace(running[n], cpus=topology.all_cpus)
    if change == "config":
        config = parse_config({**doc, "balloonTypes": [{**doc["balloonTypes"][0], "minCPUs": 1}]})
    elif change == "offline":
        topology = _offline(topology, max(topology.all_cpus))
        plan = dataclasses.replace(plan, balloons=(*plan.balloons, dataclasses.replace(
            plan.balloons[-1], index=99, cpus=frozenset({max(state.topology.all_cpus)}), members=())))
    else:
        plan = _other_reserved(state, plan)
    with pytest.raises(SavedPlanError, match=why):
        rebuild_from(config, topology, running, plan)


async def test_a_restarted_hook_puts_back_a_container_kubelet_restarted_while_it_was_down(tmp_path: Path, caplog) -> None:
    """End to end: pod a split over work[0] and work[1], its container two
    restarted by kubelet while the hook was down (on every CPU): the next
    hook gets the saved balloons back, moves that container alone to its
    balloon's CPUs, and says so once (before: the saved balloons were not
    used, a's containers merged into work[0] on 1,3, both moved)."""
    state_dir = tmp_path / "state"
    config = {**SPLIT, "stateDir": str(state_dir)}
    hook, root = await _split_pod(tmp_path, config)
    await written(hook)
    token = ReservedFile(state_dir).load().token
    before = balloons(hook)
    assert before[1:] == [("work[0]", "1", ["a-one"]), ("work[1]", "3", ["a-two"])]
    runtime = FakeRuntime()
    every = Topology.from_sysfs(root).all_cpus
    runtime.live = [dataclasses.replace(f, container_id="a-two-again", cpus=every) if f.key == ("a", "two") else f
                    for f in running(hook)]
    again = BalloonsHook(str(tmp_path / "restarted.sock"), parse_config(config), sysfs_root=root, runtime=runtime)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await again.rebuild()
    assert await again.apply_moves()
    assert balloons(again)[1:] == [("work[0]", "1", ["a-one"]), ("work[1]", "3", ["a-two-again"])]
    assert runtime.updates == [("a-two-again", "3", "0")]
    [record] = [r for r in caplog.records if r.getMessage().startswith("balloons at start")]
    assert record.getMessage() == (f"balloons at start: the saved balloons in {state_dir / 'balloons.json'} (1 container(s) "
                                   "put back in their saved balloon; 1 to move)")
    assert (record.saved, record.put_back, record.not_put_back, record.placed, record.moves) == \
        (True, ["apps/pod-a/two in work[1]"], [], [], ["apps/pod-a/two"])
    assert await _saved_again(again, state_dir, token) == \
        [("reserved[0]", []), ("work[0]", [("a", "one")]), ("work[1]", [("a", "two")])]


async def test_a_restarted_hook_places_a_container_started_while_it_was_down(tmp_path: Path, caplog) -> None:
    """End to end: pod c's container started while the hook was down (on
    every CPU): placed as a new one once the saved balloons are back (as
    PreCreateContainer would: work[0] has room, grows for it, a-one moves
    with it), which keep pod a split (before: the saved balloons were not used, a's
    containers merged into work[0] on 1,3)."""
    state_dir = tmp_path / "state"
    config = {**SPLIT, "stateDir": str(state_dir)}
    hook, root = await _split_pod(tmp_path, config)
    await written(hook)
    token = ReservedFile(state_dir).load().token
    runtime = FakeRuntime()
    every = Topology.from_sysfs(root).all_cpus
    [one] = [f for f in running(hook) if f.key == ("a", "one")]
    pod_c = dataclasses.replace(one.pod, pod_name="pod-c")
    runtime.live = [*running(hook), dataclasses.replace(one, container_id="c-one", key=("c", "one"), pod=pod_c,
                                                         pod_uid="c", cpus=every)]
    again = BalloonsHook(str(tmp_path / "restarted.sock"), parse_config(config), sysfs_root=root, runtime=runtime)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await again.rebuild()
    assert await again.apply_moves()
    # As PreCreateContainer places it: work[0] has room, grows for it, and a-one moves with it.
    assert balloons(again)[1:] == [("work[0]", "1-2", ["a-one", "c-one"]), ("work[1]", "3", ["a-two"])]
    assert sorted(runtime.updates) == [("a-one", "1-2", "0"), ("c-one", "1-2", "0")]
    [record] = [r for r in caplog.records if r.getMessage().startswith("balloons at start")]
    assert record.getMessage().endswith("(1 not in a saved balloon placed as new; 2 to move)")
    assert (record.saved, record.put_back, record.placed, sorted(record.moves)) == \
        (True, [], ["apps/pod-c/one in work[0]"], ["apps/pod-a/one", "apps/pod-c/one"])
    assert await _saved_again(again, state_dir, token) == \
        [("reserved[0]", []), ("work[0]", [("a", "one"), ("c", "one")]), ("work[1]", [("a", "two")])]


async def test_a_restarted_hook_places_containers_started_while_it_was_down_in_the_order_they_were_created(
        tmp_path: Path) -> None:
    """Pods c, then d, started while the hook was down, the runtime listing
    d first: placed as when the hook ran, c in work[0], which it fills, d in
    work[1] (before: in the runtime's order, d took work[0])."""
    ids = {"c": "f1c", "d": "0ad"}  # their ids sort the other way: created_at, not the id, says the order
    ref, _ = await _split_pod(tmp_path / "ref", SPLIT)
    for uid in "cd":
        await ref.pre_create_container(request(uid, "one", shares=1024))
        await ref.pre_start_container(request(uid, "one", cid=ids[uid]))
    assert await ref.apply_moves()
    at_run_time = balloons(ref)
    assert at_run_time[1:] == [("work[0]", "1-2", ["a-one", "f1c"]), ("work[1]", "3-4", ["a-two", "0ad"])]
    config = {**SPLIT, "stateDir": str(tmp_path / "state")}
    hook, root = await _split_pod(tmp_path, config)
    await written(hook)
    runtime = FakeRuntime()
    every = Topology.from_sysfs(root).all_cpus
    [one] = [f for f in running(hook) if f.key == ("a", "one")]
    runtime.live = [*running(hook), *(
        dataclasses.replace(one, container_id=ids[uid], key=(uid, "one"), pod=dataclasses.replace(one.pod, pod_name=f"pod-{uid}"),
                            pod_uid=uid, cpus=every, created_at=created)
        for uid, created in (("d", 2_000), ("c", 1_000)))]
    again = BalloonsHook(str(tmp_path / "restarted.sock"), parse_config(config), sysfs_root=root, runtime=runtime)
    await again.rebuild()
    assert await again.apply_moves()
    assert balloons(again) == at_run_time


def _placed(doc: dict, topology: Topology, *pods: tuple[str, int]) -> Assignments:
    """``pods`` (uid, request in milli-CPUs), container c of each, placed in
    turn under ``doc`` and given their cpusets, as at run time, every move done."""
    state = Assignments(parse_config(doc), topology)
    for uid, milli in pods:
        key = (uid, "c")
        state.place(Member(key, "apps", uid, milli, f"id-{uid}"), PodContext("apps", uid, "c"))
        state.given(key, state.target(key))
        for move in state.moves():
            state.moved(move)
    return state


def test_a_container_its_saved_balloon_no_longer_fits_is_not_said_to_be_put_back() -> None:
    """p0 and p1 share work[0] (maxCPUs 2); p1, found on every CPU, now asks
    for 2000m (its request grew while the hook was down): work[0] cannot
    take it, it goes to work[1] (before: logged as "put back in their saved
    balloon: apps/p1/c in work[1]")."""
    state = _placed(SPLIT, FOUR, ("p0", 1000), ("p1", 1000))
    assert as_saved(state)[1:] == [("work[0]", frozenset({1, 2}), [("p0", "c"), ("p1", "c")])]
    running = found(state, {("p1", "c")})
    running[1] = dataclasses.replace(running[1], member=dataclasses.replace(running[1].member, milli=2000))
    restart = rebuild_from(state.config, FOUR, running, snapshot(state))
    assert restart.state.pool.balloon_of(("p1", "c")).name == "work[1]"
    assert (restart.put_back, restart.not_put_back) == ({}, {("p1", "c"): ("apps/p1/c", "work[0]", "work[1]")})
    # work[0] shrinks to p0's one CPU: p0 moves too.
    assert restart.summary() == "1 not put back in their saved balloon, which has no room for them now; 2 to move"
    assert restart.fields()["not_put_back"] == ["apps/p1/c saved in work[0], now work[1]"]


UNPINNED = {"reservedResources": {"cpu": "cpuset:0"}, "pinCPU": False,
            "balloonTypes": [{"name": "work", "namespaces": ["*"]}]}


def test_a_restart_under_pin_cpu_false_puts_back_no_container() -> None:
    """Guards existing behaviour: no cpuset names CPUs (the saved balloons'
    do), so none is taken for off its balloon; all back as saved, none moved."""
    state = _placed(UNPINNED, TWO_NODES, ("a", 1000), ("b", 3000))
    restart = rebuild_from(state.config, TWO_NODES, found(state), snapshot(state))
    assert as_saved(restart.state) == as_saved(state)
    assert (restart.put_back, restart.not_put_back, restart.moves) == ({}, {}, [])


@pytest.mark.parametrize("at", ["a restart", "reconcile"])
def test_a_new_container_under_pin_cpu_false_on_its_balloons_memory_nodes_is_not_moved(at: str) -> None:
    """Found on node 0's memory, which its balloon has (its cpuset names no
    CPUs): recorded as running there, not moved (before: not recorded,
    always moved), at a restart from the saved balloons as at reconcile."""
    state = _placed(UNPINNED, TWO_NODES, ("a", 1000))
    key, pod = ("b", "c"), PodContext("apps", "b", "c")
    if at == "a restart":
        new = Restored(Member(key, "apps", "b", 1000, "id-b"), pod, frozenset(), "0")
        state = rebuild_from(state.config, TWO_NODES, [*found(state), new], snapshot(state)).state
    else:
        state.reconcile(Listing([*running_of(state), FoundContainer("id-b", key, pod, "b", frozenset(), "0", 1024)], []),
                        0.0, 0.0)
    assert state.pool.balloon_of(key).name == "work[0]" and state.target(key) == ("", "0")
    assert state.moves() == []


def running_of(state: Assignments) -> list[FoundContainer]:
    """``state``'s containers as the runtime lists them: on what they were given."""
    return [FoundContainer(m.container_id, m.key, state.pods[m.key], m.pod_uid, parse_cpuset(state.applied[m.key][0]),
                           state.applied[m.key][1], 1024) for _, m in state.pool.members()]


# maxCPUs 1, not preferNewBalloons: p0 (600m) in work[0], p1 (600m), which
# it cannot take, in work[1]; each has room for 300m more.
ONE_CPU = {"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "work", "namespaces": ["*"], "maxCPUs": 1}]}


@pytest.mark.parametrize("on", ["every CPU", "a CPU of its own"])
def test_a_new_container_is_placed_in_the_saved_balloons_order_by_its_type(on: str) -> None:
    """Guards existing behaviour: the runtime lists p1's container first, so
    the rebuild makes work[1] first; q, new, is placed once the saved order
    is back (placed before, it joined work[1]), in work[0], as at run time.
    Found on a CPU no balloon has, it is placed by its type too, not
    restored by that CPU (a balloon of its own)."""
    state = _placed(ONE_CPU, FOUR, ("p0", 600), ("p1", 600))
    plan = snapshot(state)
    assert [format_cpuset(b.cpus) for b in state.pool.balloons] == ["0", "1", "2"]
    cpus = FOUR.all_cpus if on == "every CPU" else frozenset({3})
    running = found(state)[::-1]
    new = Restored(Member(("q", "c"), "apps", "q", 300, "id-q"), PodContext("apps", "q", "c"), cpus, "0")
    restart = rebuild_from(state.config, FOUR, [*running, new], plan)
    at_run_time = _placed(ONE_CPU, FOUR, ("p0", 600), ("p1", 600), ("q", 300))
    assert as_saved(restart.state) == as_saved(at_run_time)
    assert restart.placed == {("q", "c"): ("apps/q/c", "work[0]")} and restart.moves == ["apps/q/c"]


def test_a_restarts_log_line_counts_the_containers_and_its_fields_list_twenty_of_each() -> None:
    """25 containers started while the hook was down: the message says how
    many, each field lists 20 and how many more (before: every label in the
    message, again in its reason and again in its fields, several KB a line
    with 200 containers)."""
    state = _placed(UNPINNED, TWO_NODES, ("a", 1000))
    new = [Restored(Member((f"n{n:02}", "c"), "apps", f"n{n:02}", 0, f"id-n{n:02}"), PodContext("apps", f"n{n:02}", "c"),
                    TWO_NODES.all_cpus, "0-1", created=n + 1) for n in range(25)]
    restart = rebuild_from(state.config, TWO_NODES, [*found(state), *new], snapshot(state))
    assert restart.summary() == "25 not in a saved balloon placed as new; 25 to move"
    fields = restart.fields()
    assert fields["placed"] == [*(f"apps/n{n:02}/c in work[0]" for n in range(20)), "and 5 more"]
    assert fields["moves"][20:] == ["and 5 more"] and (fields["put_back"], fields["not_put_back"]) == ([], [])


def test_two_new_containers_of_one_label_are_each_placed() -> None:
    """A pod recreated under its name (a new uid) while an old one's
    container still runs: both, new to the saved balloons, are listed as
    placed, by container (before: keyed by label, one hid the other and the
    summary counted one)."""
    state = _placed(ONE_CPU, FOUR, ("p0", 600))
    old = Restored(Member(("q-old", "c"), "apps", "q", 300, "id-old"), PodContext("apps", "q", "c"), frozenset({3}), "0")
    new = Restored(Member(("q-new", "c"), "apps", "q", 300, "id-new"), PodContext("apps", "q", "c"), frozenset({3}), "0")
    assert old.member.label == new.member.label
    restart = rebuild_from(state.config, FOUR, [*found(state), old, new], snapshot(state))
    assert set(restart.placed) == {("q-old", "c"), ("q-new", "c")}
    assert "2 not in a saved balloon placed as new" in restart.summary()
