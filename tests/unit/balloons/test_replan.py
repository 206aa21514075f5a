"""A re-plan (hotplug, a reload) and a restart rebuild the balloons from what
the containers run on: none whose balloon stays as it was may move. Machines
as in test_hotplug: CPUs 0-3 on NUMA node 0, 4-7 on node 1.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import yaml

from hooks.balloons import restoring
from hooks.balloons.balloon import Member
from hooks.balloons.config import BALLOON_ANNOTATION, PodContext, parse_config
from hooks.balloons.planning import Restored, reserved_to_keep
from hooks.balloons.runtime import FoundContainer
from hooks.balloons.server import BalloonsHook
from hooks.balloons.state import Assignments
from hooks.balloons.topology import Topology, format_cpuset, parse_cpuset

from .test_hotplug import QUANTITY, WORK, balloons, hook_on_sysfs, set_online, three_pods
from .test_server import FakeRuntime, request


def running(hook: BalloonsHook) -> list[FoundContainer]:
    """The hook's containers as the runtime lists them: on the cpusets it gave them."""
    state = hook.state
    return [
        FoundContainer(m.container_id, m.key, state.pods[m.key], m.pod_uid, parse_cpuset(state.applied[m.key][0]),
                       state.applied[m.key][1], math.ceil(m.milli * 1024 / 1000))
        for _, m in state.pool.members()
    ]


async def restarted(hook: BalloonsHook, tmp_path: Path, root: Path, config: dict[str, Any],
                    **options: Any) -> tuple[BalloonsHook, FakeRuntime]:
    """Another hook on the same machine (``options``: BalloonsHook's),
    rebuilt from ``hook``'s containers, its moves done."""
    runtime = FakeRuntime()
    runtime.live = running(hook)
    again = BalloonsHook(str(tmp_path / "restarted.sock"), parse_config(config), sysfs_root=root, runtime=runtime,
                         **options)
    await again.rebuild()
    assert await again.apply_moves()
    return again, runtime


async def three_pods_in_two_balloons(hook: BalloonsHook) -> None:
    """preferNewBalloons, maxBalloons 2: pods a and b get a balloon each; c,
    the third, shares a's (the first with room to grow), grown to 1-3,6."""
    for uid in "abc":
        await hook.pre_create_container(request(uid, "app", shares=2048))
        await hook.pre_start_container(request(uid, "app", cid=f"c-{uid}"))
    assert await hook.apply_moves()
    assert balloons(hook) == [("reserved[0]", "0", []), ("work[0]", "1-3,6", ["c-a", "c-c"]), ("work[1]", "4-5", ["c-b"])]


async def test_a_pod_put_in_another_pods_balloon_stays_there_after_hotplug(tmp_path) -> None:
    """Restored after a, c took a balloon of its own (CPU-less, the type had
    room) and b, last, found none: pods b and c swapped balloons."""
    hook, runtime, root = await hook_on_sysfs(tmp_path)
    await three_pods_in_two_balloons(hook)
    moved = len(runtime.updates)
    set_online(root, "0-6")  # CPU 7, free, goes offline
    await hook.reconcile()
    assert await hook.apply_moves()
    assert runtime.updates[moved:] == []
    assert balloons(hook)[1:] == [("work[0]", "1-3,6", ["c-a", "c-c"]), ("work[1]", "4-5", ["c-b"])]


async def test_a_pod_put_in_another_pods_balloon_stays_there_after_a_restart(tmp_path) -> None:
    hook, _, root = await hook_on_sysfs(tmp_path)
    await three_pods_in_two_balloons(hook)
    again, runtime = await restarted(hook, tmp_path, root, WORK)
    assert runtime.updates == []
    assert balloons(again) == balloons(hook)


async def test_a_container_whose_move_was_refused_keeps_its_balloon_after_hotplug(tmp_path, caplog) -> None:
    """c, first seen at its start, joined a's balloon (one of its own needed
    minCPUs 2, and one CPU was free), but its move there was refused: it runs
    on every CPU. Placed anew when CPUs came online, it took a balloon of its
    own, and a's shrank back to a's request: a moved."""
    config = {**WORK, "balloonTypes": [{"name": "work", "namespaces": ["*"], "minCPUs": 2, "preferNewBalloons": True}]}
    hook, runtime, root = await hook_on_sysfs(tmp_path, config)
    set_online(root, "0-3")
    await hook.reconcile()
    await hook.pre_create_container(request("a", "app", shares=2048))
    await hook.pre_start_container(request("a", "app", cid="c-a"))
    runtime.refused.add("c-c")
    await hook.pre_start_container(request("c", "app", shares=1024, cid="c-c"))
    assert not await hook.apply_moves()
    assert runtime.updates == [("c-a", "1-3", "0")]
    planned = balloons(hook)
    assert planned[1:] == [("work[0]", "1-3", ["c-a", "c-c"])]
    set_online(root, "0-7")
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await hook.reconcile()
    assert balloons(hook) == planned
    assert "restoring container apps/pod-c/app to balloon work[0] (its balloon had cpus 1-3; its move there was " \
        "refused" in caplog.text
    runtime.refused.clear()
    assert await hook.apply_moves()
    assert runtime.updates[1:] == [("c-c", "1-3", "0")]


def test_a_container_refused_its_move_is_placed_anew_when_a_reload_changed_its_type(caplog) -> None:
    """b's side container (first seen at its start) was refused its move to
    default[0], then b's app joined it: 1-3. A reload gives side containers
    a type of their own: side is placed anew there, and app keeps its CPUs.
    Taken for its old balloon's, they made side[0], and app, restored after,
    got what was left (2-3, not the 1-2 it keeps now)."""
    base = {"reservedResources": {"cpu": "cpuset:0"}}
    side = {"name": "side", "matchExpressions": [{"key": "name", "operator": "In", "values": ["side"]}]}
    topology = Topology.synthetic(1, 2, 4, 1)
    state = Assignments(parse_config(base), topology)
    pod = lambda name: PodContext("apps", "pod-b", name)  # noqa: E731
    state.place(Member(("b", "side"), "apps", "pod-b", 1000, "c-s"), pod("side"))
    state.place(Member(("b", "app"), "apps", "pod-b", 2000, "c-a"), pod("app"))
    state.given(("b", "app"), ("1-3", "0"))
    [move] = state.moves()
    state.not_moved(move)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        again = restoring.replan(state, parse_config({**base, "balloonTypes": [side]}), topology)
    assert {b.name: format_cpuset(b.cpus) for b in again.pool.balloons} == {"reserved[0]": "0", "default[0]": "1-2", "side[0]": "3"}
    assert "assigning running container apps/pod-b/side to balloon side[0]" in caplog.text
    assert "refused" not in caplog.text


async def reserved_kept_after_a_restart(
    hook: BalloonsHook, tmp_path: Path, root: Path, config: dict[str, Any], reserved: str
) -> None:
    """Once ``hook``'s moves are done its reserved CPUs are ``reserved``; a
    restart keeps them, moves nothing and restores the same balloons."""
    assert await hook.apply_moves()
    assert hook.status()["reserved_cpus"] == reserved
    again, runtime = await restarted(hook, tmp_path, root, config)
    assert (again.status()["reserved_cpus"], runtime.updates) == (reserved, [])
    assert balloons(again) == balloons(hook)


async def test_reserved_cpus_a_reload_kept_stay_reserved_after_a_restart(tmp_path) -> None:
    """Two reserved CPUs rather than one: the reload kept 0 and took 3; a fresh
    pick at the restart took 0-1, CPU 1 from a's balloon, and moved a and c-k."""
    hook, _, root = await hook_on_sysfs(tmp_path, QUANTITY)
    await three_pods(hook)
    config = {**QUANTITY, "reservedResources": {"cpu": "2"}}
    path = tmp_path / "balloons.yaml"
    path.write_text(yaml.safe_dump(config))
    assert await hook.reload(path)
    await reserved_kept_after_a_restart(hook, tmp_path, root, config, "0,3")


async def test_reserved_cpus_hotplug_replaced_stay_reserved_after_a_restart(tmp_path) -> None:
    hook, _, root = await hook_on_sysfs(tmp_path, QUANTITY)
    await three_pods(hook)
    set_online(root, "1-7")  # the reserved CPU 0 goes offline: 3 replaces it
    await hook.reconcile()
    set_online(root, "0-7")  # back, free
    await hook.reconcile()
    await reserved_kept_after_a_restart(hook, tmp_path, root, QUANTITY, "3")


async def test_reserved_cpus_picked_at_a_restart_avoid_the_cpus_containers_run_on(tmp_path) -> None:
    """No container of the reserved type runs: a fresh pick, but not of CPU
    0, which a's balloon holds (the reserved CPUs were elsewhere before)."""
    hook, _, root = await hook_on_sysfs(tmp_path, {**QUANTITY, "reservedResources": {"cpu": "cpuset:3"}})
    await hook.pre_create_container(request("a", "app", shares=2048))
    await hook.pre_start_container(request("a", "app", cid="c-a"))
    assert await hook.apply_moves()
    assert balloons(hook)[1:] == [("work[0]", "0-1", ["c-a"])]
    again, runtime = await restarted(hook, tmp_path, root, QUANTITY)
    assert (again.status()["reserved_cpus"], runtime.updates) == ("2", [])


def test_the_reserved_cpus_kept_at_start_up_are_those_the_reserved_types_containers_run_on() -> None:
    config = parse_config(QUANTITY)
    topology = Topology.synthetic(1, 2, 4, 1)
    apps = PodContext("apps", "web", "app")
    running = [
        (PodContext("kube-system", "dns", "dns"), frozenset({0, 3})),
        (apps, frozenset({0, 3})),  # a balloon without CPUs: on the reserved ones, not busy
        (apps, frozenset({1, 2})),
        (apps, topology.all_cpus),  # not pinned
        (PodContext("apps", "x", "app", {}, {BALLOON_ANNOTATION: "nope"}), frozenset({5})),  # an unknown type
    ]
    assert reserved_to_keep(config, topology, running, None) == ({0, 3}, {1, 2, 5})
    # A re-plan keeps the reserved CPUs of the plan before; every other CPU a container runs on is avoided.
    assert reserved_to_keep(config, topology, running, frozenset({3})) == ({3}, {0, 1, 2, 5})



# One NUMA node, four cores of two threads: CPU n and n+4 are one core's.
SMT = Topology.synthetic(1, 1, 4, 2)
SHARING = {
    "reservedResources": {"cpu": "1"},
    "balloonTypes": [{"name": "work", "namespaces": ["apps"], "preferNewBalloons": True, "shareIdleCPUsInSame": "system"}],
}


async def test_with_no_reserved_container_a_restart_keeps_a_first_starts_reserved_cpus(tmp_path) -> None:
    """A pick around the busy CPUs 1,2,6 would take 5, CPU 1's idle sibling,
    for 0: b and c, on their CPUs and the idle ones, would move."""
    hook, _, root = await hook_on_sysfs(tmp_path, SHARING, SMT)
    for uid, shares in (("a", 1024), ("b", 1024), ("c", 2048)):
        await hook.pre_create_container(request(uid, "app", shares=shares))
        await hook.pre_start_container(request(uid, "app", cid=f"c-{uid}"))
    await hook.post_stop_container(request("a", "app", cid="c-a"))
    assert await hook.apply_moves()
    assert (hook.status()["reserved_cpus"], balloons(hook)[1:]) == ("0", [("work[1]", "1", ["c-b"]), ("work[2]", "2,6", ["c-c"])])
    again, runtime = await restarted(hook, tmp_path, root, SHARING)
    assert (again.status()["reserved_cpus"], runtime.updates) == ("0", [])
    assert [b[1:] for b in balloons(again)] == [b[1:] for b in balloons(hook)]


async def test_a_restart_keeps_the_reserved_cpus_of_a_reserved_type_sharing_idle_cpus(tmp_path) -> None:
    """Its containers run on the reserved CPU and the idle ones, 0-3,5-7: not
    the most compact of these, 1, is reserved, but the first start's 0."""
    config = {
        "reservedResources": {"cpu": "1"},
        "balloonTypes": [{"name": "work", "namespaces": ["apps"]}, {"name": "reserved", "shareIdleCPUsInSame": "system"}],
    }
    hook, _, root = await hook_on_sysfs(tmp_path, config, SMT)
    for uid, ns in (("a", "apps"), ("dns", "kube-system")):
        await hook.pre_create_container(request(uid, "app", ns=ns, shares=1024))
        await hook.pre_start_container(request(uid, "app", ns=ns, cid=f"c-{uid}"))
    assert await hook.apply_moves()
    assert balloons(hook) == [("reserved[0]", "0", ["c-dns"]), ("work[0]", "4", ["c-a"])]
    again, runtime = await restarted(hook, tmp_path, root, config)
    assert (again.status()["reserved_cpus"], runtime.updates) == ("0", [])
    assert balloons(again) == balloons(hook)


async def pods_a_and_b_in_new_balloons(tmp_path: Path) -> tuple[BalloonsHook, FakeRuntime, dict[str, Any]]:
    """Pods a and b, each in a balloon of its own (preferNewBalloons), on 1 and 2 of 8 CPUs."""
    config = {"reservedResources": {"cpu": "cpuset:0"},
              "balloonTypes": [{"name": "work", "namespaces": ["*"], "preferNewBalloons": True}]}
    hook, runtime, _ = await hook_on_sysfs(tmp_path, config, Topology.synthetic(1, 1, 8, 1))
    for uid in "ab":
        await hook.pre_create_container(request(uid, "app", shares=1024))
        await hook.pre_start_container(request(uid, "app", cid=f"c-{uid}"))
    return hook, runtime, config


async def reloaded_with(hook: BalloonsHook, tmp_path: Path, config: dict[str, Any], **work: Any) -> None:
    """The config reloaded with ``work`` set on its work type, and the moves it asks made."""
    config["balloonTypes"][0].update(work)
    path = tmp_path / "balloons.yaml"
    path.write_text(yaml.safe_dump(config))
    assert await hook.reload(path)
    assert await hook.apply_moves()


async def test_pods_on_cpus_a_min_balloon_would_take_keep_a_balloon_each_on_a_reload(tmp_path) -> None:
    """a on 1 and b on 2, then minBalloons 1 of minCPUs 2: a balloon made for
    it before the containers were restored took 1-2, a joined it, and b,
    none of its CPUs left to others, joined a."""
    hook, _, config = await pods_a_and_b_in_new_balloons(tmp_path)
    assert balloons(hook)[1:] == [("work[0]", "1", ["c-a"]), ("work[1]", "2", ["c-b"])]
    await reloaded_with(hook, tmp_path, config, minBalloons=1, minCPUs=2)
    assert [(cpus, ids) for _, cpus, ids in balloons(hook)[1:]] == [("1,3", ["c-a"]), ("2,4", ["c-b"])]


async def test_a_pod_keeps_its_cpus_when_a_reload_adds_a_min_balloon_up_to_max_balloons(tmp_path, caplog) -> None:
    """b on 2, then minBalloons and maxBalloons 1: a balloon made for it
    before b was restored took 1, the only one the type may have, and b,
    placed anew, was moved there. b's balloon keeps its name, work[1]."""
    hook, runtime, config = await pods_a_and_b_in_new_balloons(tmp_path)
    await hook.post_stop_container(request("a", "app", cid="c-a"))
    assert await hook.apply_moves()
    assert balloons(hook)[1:] == [("work[1]", "2", ["c-b"])]
    moved = len(runtime.updates)
    await reloaded_with(hook, tmp_path, config, minBalloons=1, maxBalloons=1)
    assert (balloons(hook)[1:], runtime.updates[moved:]) == ([("work[1]", "2", ["c-b"])], [])
    assert "cannot be sized" not in caplog.text
    # maxBalloons counts balloons, not indexes: pod c (preferNewBalloons) joins work[1].
    answer = await hook.pre_create_container(request("c", "app", shares=1024))
    assert (answer.container_resources.cpuset_cpus, balloons(hook)[1:]) == ("1-2", [("work[1]", "1-2", ["c-b", ""])])


async def test_a_container_placed_anew_on_the_cpus_it_runs_on_is_not_moved(tmp_path) -> None:
    """The reserved type shares the idle CPUs, and there is no other balloon:
    dns runs on every CPU, taken for not pinned, placed anew, and was moved
    to the same CPUs."""
    config = {"reservedResources": {"cpu": "1"}, "balloonTypes": [{"name": "reserved", "shareIdleCPUsInSame": "system"}]}
    hook, _, root = await hook_on_sysfs(tmp_path, config)
    await hook.pre_create_container(request("dns", "dns", ns="kube-system", shares=1024))
    await hook.pre_start_container(request("dns", "dns", ns="kube-system", cid="c-dns"))
    assert [(c.container_id, c.cpus) for c in running(hook)] == [("c-dns", frozenset(range(8)))]
    again, runtime = await restarted(hook, tmp_path, root, config)
    assert (again.status()["reserved_cpus"], runtime.updates) == ("0", [])


async def test_a_min_balloon_made_at_a_restart_takes_cpus_no_container_runs_on(tmp_path) -> None:
    """Left empty on 2,6 (a's balloon went first), it took the fresh pick 1,5
    instead, idle CPUs dns ran on: dns moved."""
    config = {
        "reservedResources": {"cpu": "1"},
        "balloonTypes": [
            {"name": "work", "namespaces": ["apps"], "preferNewBalloons": True, "minBalloons": 1, "minCPUs": 2},
            {"name": "reserved", "shareIdleCPUsInSame": "system"},
        ],
    }
    hook, _, root = await hook_on_sysfs(tmp_path, config, SMT)
    for uid, ns in (("dns", "kube-system"), ("a", "apps"), ("b", "apps")):
        await hook.pre_create_container(request(uid, "app", ns=ns, shares=2048))
        await hook.pre_start_container(request(uid, "app", ns=ns, cid=f"c-{uid}"))
    for uid in "ab":
        await hook.post_stop_container(request(uid, "app", cid=f"c-{uid}"))
    assert await hook.apply_moves()
    assert balloons(hook) == [("reserved[0]", "0", ["c-dns"]), ("work[1]", "2,6", [])]
    assert [c.cpus for c in running(hook)] == [parse_cpuset("0-1,3-5,7")]
    again, runtime = await restarted(hook, tmp_path, root, config)
    assert ([b[1:] for b in balloons(again)], runtime.updates) == ([("0", ["c-dns"]), ("2,6", [])], [])


def placed(uid: str, cpus: frozenset[int]) -> Restored:
    return Restored(Member((uid, "app"), "apps", uid, 1000, f"c-{uid}"), PodContext("apps", uid, "app"), cpus, "0")


def test_a_container_on_every_cpu_is_not_taken_for_pinned_after_cpus_came_online() -> None:
    """a and b, found on every CPU (kubelet's shared pool), got 1 and 2; a's
    move was refused. With 4-5 online, 0-3 was taken for a's own CPUs: its
    balloon took all those free, b's 2 too, b joined it, and both moved."""
    config = parse_config({"reservedResources": {"cpu": "1"},
                           "balloonTypes": [{"name": "work", "namespaces": ["*"], "preferNewBalloons": True}]})
    four = Topology.synthetic(1, 1, 4, 1)
    state = restoring.rebuild(config, four, [placed("a", four.all_cpus), placed("b", four.all_cpus)])
    for move in state.moves():
        (state.not_moved if move.key[0] == "a" else state.moved)(move)
    assert (state.applied[("a", "app")], state.applied[("b", "app")]) == (("0-3", "0"), ("2", "0"))
    again = restoring.replan(state, config, Topology.synthetic(1, 1, 6, 1))
    layout = [(format_cpuset(b.cpus), sorted(k[0] for k in b.members)) for b in again.pool.balloons]
    assert sorted(layout) == [("0", []), ("1", ["a"]), ("2", ["b"])]
    assert [(m.key[0], m.cpuset) for m in again.moves()] == [("a", ("1", "0"))]


def test_a_container_whose_cpus_went_offline_joins_its_types_empty_balloon() -> None:
    """b's 4 went offline and a kept 1-3: the minBalloons balloon made for b's
    type got no CPU, b could not grow it, and went to the default balloon."""
    config = parse_config({"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [
        {"name": "work", "namespaces": ["*"], "minBalloons": 2, "preferNewBalloons": True}]})
    six = Topology.synthetic(1, 1, 6, 1)
    state = Assignments(config, six)
    for uid, milli in (("a", 3000), ("b", 1000)):
        state.place(Member((uid, "app"), "apps", uid, milli, f"c-{uid}"), PodContext("apps", uid, "app"))
        state.given((uid, "app"), state.target((uid, "app")))
    assert [state.target((uid, "app")) for uid in "ab"] == [("1-3", "0"), ("4", "0")]
    again = restoring.replan(state, config, Topology({cpu: info for cpu, info in six.cpus.items() if cpu < 4}))
    layout = [(b.name, format_cpuset(b.cpus), sorted(k[0] for k in b.members)) for b in again.pool.balloons]
    assert layout == [("reserved[0]", "0", []), ("work[0]", "1-3", ["a"]), ("work[1]", "", ["b"])]


def test_running_containers_their_type_cannot_take_join_their_pods_balloon_else_an_empty_one() -> None:
    """No CPU free after a's first container took 1-3: the others went to the
    default balloon. c still does: work has no room for a third balloon."""
    config = parse_config({"reservedResources": {"cpu": "cpuset:0"},
                           "balloonTypes": [{"name": "work", "namespaces": ["*"], "minBalloons": 2, "maxBalloons": 2}]})
    four = Topology.synthetic(1, 1, 4, 1)
    first = Restored(Member(("a", "one"), "apps", "a", 3000, "c-a1"), PodContext("apps", "a", "one"), frozenset({1, 2, 3}))
    state = restoring.rebuild(config, four, [first, placed("a", four.all_cpus), *(placed(uid, four.all_cpus) for uid in "bc")])
    layout = [(b.name, format_cpuset(b.cpus), sorted(k[0] + "/" + k[1] for k in b.members)) for b in state.pool.balloons]
    assert layout == [("reserved[0]", "0", []), ("work[0]", "1-3", ["a/app", "a/one"]), ("work[1]", "", ["b/app"]),
                      ("default[0]", "", ["c/app"])]


def test_running_containers_placed_anew_get_cpus_before_an_empty_min_balloon_grows_to_min_cpus() -> None:
    """idle's minBalloons balloon, made of 4 alone (1-3 w1's), grew to 2,4
    when w1's balloon shrank, before w2, never pinned, was placed: w2's
    2 CPUs got only 3."""
    config = parse_config({"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [
        {"name": "idle", "namespaces": ["idle"], "minBalloons": 1, "minCPUs": 2}, {"name": "work", "namespaces": ["*"]}]})
    five = Topology.synthetic(1, 1, 5, 1)
    w2 = Restored(Member(("w2", "app"), "apps", "w2", 2000, "c-w2"), PodContext("apps", "w2", "app"), five.all_cpus)
    state = restoring.rebuild(config, five, [placed("w1", frozenset({1, 2, 3})), w2])
    layout = [(b.name, format_cpuset(b.cpus), sorted(k[0] for k in b.members)) for b in state.pool.balloons]
    assert layout == [("reserved[0]", "0", []), ("work[0]", "1-3", ["w1", "w2"]), ("idle[0]", "4", [])]
