"""A changed-config reload and a container in the default balloon because
its type had no room for it (under onExhausted: Ignore): it goes into a
balloon of its type that takes it in full, apart from its pod only where
its pod's balloon would pass maxCPUs with it, as placement splits a pod;
else it stays. Checked too by test_reload_changed_config's checker.
"""

from __future__ import annotations

from typing import Any

from hooks.balloons import restoring
from hooks.balloons.balloon import Member
from hooks.balloons.config import PodContext, parse_config
from hooks.balloons.state import Assignments
from hooks.balloons.topology import Topology, format_cpuset

from .test_reload_changed_config import check


def test_a_container_its_pods_balloon_cannot_take_leaves_the_default_balloon_for_an_empty_one_of_its_type() -> None:
    """Under Ignore, work (maxCPUs 1, minBalloons and maxBalloons 2): a/c1
    (500m), which its pod's balloon work[0] could not take, went to the
    default balloon, the type's other balloon being b's; b gone, a reload
    of a changed config left a/c1 there beside the empty work[1], taking
    its pod's full balloon for the only one it could go to (as at seed 4047
    of the checker above, after a restart, moves refused)."""
    doc: dict[str, Any] = {"reservedResources": {"cpu": "cpuset:0"}, "onExhausted": "Ignore", "balloonTypes": [
        {"name": "work", "namespaces": ["*"], "maxCPUs": 1, "minBalloons": 2, "maxBalloons": 2}]}
    topology = Topology.synthetic(1, 1, 8, 1)
    state = Assignments(parse_config(doc), topology)
    for uid, name, milli in (("a", "c0", 1000), ("b", "c0", 1000), ("a", "c1", 500)):
        state.place(Member((uid, name), "apps", uid, milli, f"id-{uid}-{name}"), PodContext("apps", uid, name))
        state.given((uid, name), state.target((uid, name)))
    state.release(("b", "c0"))
    assert [(b.name, sorted(b.members)) for b in state.pool.balloons] == [
        ("reserved[0]", []), ("work[0]", [("a", "c0")]), ("work[1]", []), ("default[0]", [("a", "c1")])]
    config = parse_config({**doc, "balloonTypes": [*doc["balloonTypes"], {"name": "batch", "namespaces": ["batch"]}]})
    again = restoring.replan(state, config, topology)
    assert [(b.name, sorted(b.members)) for b in again.pool.balloons] == [
        ("reserved[0]", []), ("work[0]", [("a", "c0")]), ("work[1]", [("a", "c1")])]
    assert check(state, again, config) == []


def test_a_container_its_pods_balloon_cannot_grow_for_stays_in_the_default_balloon_rather_than_leave_its_pod() -> None:
    """Under Ignore, work (maxCPUs 1, minCPUs 1, minBalloons and maxBalloons
    2) on CPUs 1-3: a/c1 (500m), past maxCPUs in its pod's balloon work[0],
    went to the default balloon, beside misc's d/c0; b gone, work[1] stays,
    empty, on its CPU. maxCPUs raised to 2: a/c1 fits its pod's balloon now,
    which cannot grow (no CPU free). Placement would join it there short of
    CPUs, never apart from its pod: the reload leaves it in the default
    balloon, in full. It went to the empty work[1], splitting its pod."""
    work = {"name": "work", "namespaces": ["apps"], "minCPUs": 1, "maxCPUs": 1, "minBalloons": 2, "maxBalloons": 2}
    doc: dict[str, Any] = {"reservedResources": {"cpu": "cpuset:0"}, "onExhausted": "Ignore", "balloonTypes": [work]}
    topology = Topology.synthetic(1, 1, 4, 1)
    state = Assignments(parse_config(doc), topology)
    for uid, ns, name, milli in (("a", "apps", "c0", 1000), ("b", "apps", "c0", 1000), ("a", "apps", "c1", 500),
                                 ("d", "misc", "c0", 500)):
        state.place(Member((uid, name), ns, uid, milli, f"id-{uid}-{name}"), PodContext(ns, uid, name))
        state.given((uid, name), state.target((uid, name)))
    state.release(("b", "c0"))
    before = [(b.name, format_cpuset(b.cpus), sorted(b.members)) for b in state.pool.balloons]
    assert before == [("reserved[0]", "0", []), ("work[0]", "1", [("a", "c0")]), ("work[1]", "2", []),
                      ("default[0]", "3", [("a", "c1"), ("d", "c0")])]
    config = parse_config({**doc, "balloonTypes": [{**work, "maxCPUs": 2}]})
    again = restoring.replan(state, config, topology)
    assert [(b.name, format_cpuset(b.cpus), sorted(b.members)) for b in again.pool.balloons] == before
    assert again.moves() == []
    assert check(state, again, config) == []


def test_a_container_of_a_split_pod_joins_the_pods_balloon_that_takes_it_not_the_first_one() -> None:
    """Under Ignore, work (maxCPUs 2, maxBalloons 2) on 12 CPUs: a/c0
    (2000m) fills work[0], a/c1 (500m) goes apart to work[1] with b/c0
    (1000m), and a/c2 (1500m), which neither can take within maxCPUs, to
    the default balloon. b gone, a reload with maxBalloons 3: work[1] (a/c1
    alone) takes a/c2 within maxCPUs, as placement under the new config
    would (assign_anyway joins its pod's balloon that fits). It went to a
    new work[2], only its pod's first balloon, full, being tried."""
    work = {"name": "work", "namespaces": ["apps"], "maxCPUs": 2, "maxBalloons": 2}
    doc: dict[str, Any] = {"reservedResources": {"cpu": "cpuset:0"}, "onExhausted": "Ignore", "balloonTypes": [work]}
    topology = Topology.synthetic(1, 1, 12, 1)
    state = Assignments(parse_config(doc), topology)
    for uid, name, milli in (("a", "c0", 2000), ("a", "c1", 500), ("b", "c0", 1000), ("a", "c2", 1500)):
        state.place(Member((uid, name), "apps", uid, milli, f"id-{uid}-{name}"), PodContext("apps", uid, name))
        state.given((uid, name), state.target((uid, name)))
    state.release(("b", "c0"))
    assert [(b.name, format_cpuset(b.cpus), sorted(b.members)) for b in state.pool.balloons] == [
        ("reserved[0]", "0", []), ("work[0]", "1-2", [("a", "c0")]), ("work[1]", "3", [("a", "c1")]),
        ("default[0]", "5-6", [("a", "c2")])]
    config = parse_config({**doc, "balloonTypes": [{**work, "maxBalloons": 3}]})
    again = restoring.replan(state, config, topology)
    assert [(b.name, len(b.cpus), sorted(b.members)) for b in again.pool.balloons] == [
        ("reserved[0]", 1, []), ("work[0]", 2, [("a", "c0")]), ("work[1]", 2, [("a", "c1"), ("a", "c2")])]
    assert check(state, again, config) == []
