"""A re-plan (hotplug, a reload) under pinCPU: false: no cpuset names CPUs,
so none tells which balloon a container runs on. Each goes back to the
balloon it was given, and is moved only if that balloon's memory nodes
changed. Machines as in test_hotplug: CPUs 0-3 on NUMA node 0, 4-7 on node 1.
"""

from __future__ import annotations

import logging

from hooks.balloons import restoring
from hooks.balloons.balloon import Member
from hooks.balloons.config import PodContext, parse_config
from hooks.balloons.state import Assignments
from hooks.balloons.topology import Topology, format_cpuset

TWO_NODES = Topology.synthetic(1, 2, 4, 1)


def unpinned(**work: object) -> Assignments:
    config = parse_config({"reservedResources": {"cpu": "cpuset:0"}, "pinCPU": False,
                           "balloonTypes": [{"name": "work", "namespaces": ["*"], **work}]})
    return Assignments(config, TWO_NODES)


def place(state: Assignments, uid: str, milli: int) -> None:
    key = (uid, "app")
    state.place(Member(key, "apps", f"pod-{uid}", milli, f"c-{uid}"), PodContext("apps", f"pod-{uid}", "app"))
    state.given(key, state.target(key))


def layout(state: Assignments) -> list[tuple[str, str, list[str]]]:
    return [(b.name, format_cpuset(b.cpus), [k[0] for k in b.members]) for b in state.pool.balloons]


def test_a_reload_keeps_each_container_in_its_balloon_on_its_numa_node() -> None:
    """a's balloon went, and b's stayed on node 1 (4-5). Placed anew, b took
    a balloon on node 0, where the free CPUs fit it most tightly: its memory
    moved from node 1 to node 0, at every reload and hotplug after such a
    release."""
    state = unpinned(preferNewBalloons=True)
    place(state, "a", 3000)
    place(state, "b", 2000)
    state.release(("a", "app"))
    assert layout(state)[1:] == [("work[1]", "4-5", ["b"])]
    again = restoring.replan(state, state.config, TWO_NODES)
    assert [cpus for _, cpus, _ in layout(again)] == ["0", "4-5"]
    assert again.target(("b", "app")) == ("", "1")


def test_a_reload_with_the_same_config_moves_no_container() -> None:
    """Each was recorded as running on nothing known (its cpuset names no
    CPUs): the re-plan sent every container a move to what it had."""
    state = unpinned()
    for uid in "ab":
        place(state, uid, 1000)
    again = restoring.replan(state, state.config, TWO_NODES)
    assert layout(again) == layout(state)
    assert again.moves() == []


def test_a_reload_under_pin_cpu_false_does_not_take_containers_for_refused_their_move(caplog) -> None:
    """No cpuset names CPUs: every container was logged as one whose move
    was refused, at every reload and hotplug."""
    state = unpinned()
    place(state, "a", 1000)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        restoring.replan(state, state.config, TWO_NODES)
    assert "restoring container apps/pod-a/app to balloon work[0] (its balloon had cpus 1)" in caplog.text
    assert "refused" not in caplog.text


def test_a_reload_logs_a_container_whose_move_is_unsure_or_never_given_as_such(caplog) -> None:
    """b joined a's balloon, which grew onto node 1: a's move to memory
    nodes 0-1 ended without an answer; c, first seen at its start, was
    never given a cpuset. Both go back to their balloon, logged as not
    known to run on it; b, given its cpuset, is not."""
    state = unpinned()
    place(state, "a", 3000)
    place(state, "b", 2000)
    [move] = state.moves()
    assert move.key == ("a", "app") and move.cpuset == ("", "0-1")
    state.maybe_moved(move)
    state.place(Member(("c", "app"), "apps", "pod-c", 1000, "c-c"), PodContext("apps", "pod-c", "app"))
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        again = restoring.replan(state, state.config, TWO_NODES)
    assert layout(again) == layout(state)
    astray = "; its move there was refused or may not have been applied"
    for uid, why in (("a", astray), ("b", ""), ("c", astray)):
        line = f"restoring container apps/pod-{uid}/app to balloon work[0] (its balloon had cpus 1-6{why})"
        assert line in caplog.text


def test_a_reload_keeps_fallbacks_beyond_the_default_balloons_max_cpus_in_it() -> None:
    """work's one balloon is full: b and c fall back to the default balloon,
    whose maxCPUs 1 they pass (a fallback is never refused). The reload's
    restore refused c there (maxCPUs), and c, placed anew as of the default
    type, got a new default balloon: its memory moved."""
    config = parse_config({"reservedResources": {"cpu": "cpuset:0"}, "pinCPU": False, "onExhausted": "Ignore",
                           "balloonTypes": [{"name": "work", "namespaces": ["*"], "maxBalloons": 1, "maxCPUs": 1},
                                            {"name": "default", "maxCPUs": 1}]})
    state = Assignments(config, TWO_NODES)
    for uid in "abc":
        place(state, uid, 1000)
    before = layout(state)
    assert [(name, members) for name, _, members in before] == [
        ("reserved[0]", []), ("work[0]", ["a"]), ("default[0]", ["b", "c"])]
    after = restoring.replan(state, config, TWO_NODES)
    assert layout(after) == before
    assert after.moves() == []
