"""Balloons on synthetic machines: exclusivity, min/max, sizes, types, restore."""

from __future__ import annotations

import random

import pytest

from hooks.balloons.config import BALLOON_ANNOTATION, PodContext, parse_config
from hooks.balloons.balloon import Member, milli_from_shares
from hooks.balloons.pool import Exhausted, Pool, PoolError
from hooks.balloons.planning import UnknownBalloonType, choose_type
from hooks.balloons.topology import Topology

from .test_allocator import SHAPES, shape


def pool(topology: Topology, *types: dict, **top) -> Pool:
    doc = {"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": list(types), **top}
    return Pool(parse_config(doc), topology)


def member(pod: str, name: str = "c", milli: int = 1000, ns: str = "default") -> Member:
    return Member((pod, name), ns, f"pod-{pod}", milli)


def check_invariants(p: Pool) -> None:
    owned: set[int] = set()
    for balloon in p.balloons:
        assert not balloon.cpus & owned, f"{balloon.name} shares CPUs with another balloon"
        owned |= balloon.cpus
        assert balloon.cpus <= p.available
        if balloon.fixed:
            assert balloon.cpus == p.reserved
            continue
        t = balloon.btype
        assert len(balloon.cpus) >= t.min_cpus
        if t.max_cpus:
            assert len(balloon.cpus) <= t.max_cpus
        assert len(balloon.cpus) == balloon.target_size(), balloon.name
    for btype in p.types.values():
        if btype.max_balloons:
            assert len(p.of_type(btype.name)) <= btype.max_balloons


def test_shares_to_milli_cpus() -> None:
    assert [milli_from_shares(s) for s in (0, 2, 102, 512, 1024, 1536)] == [0, 0, 100, 500, 1000, 1500]


@pytest.mark.parametrize("name", SHAPES)
def test_random_churn_keeps_balloons_exclusive_and_sized(name) -> None:
    topo = shape(name)
    types = [
        {"name": "small", "namespaces": ["small"], "maxCPUs": 3, "maxBalloons": 4},
        {"name": "big", "namespaces": ["big"], "minCPUs": 2, "minBalloons": 1, "preferNewBalloons": True},
        {"name": "shared", "namespaces": ["shared"], "shareIdleCPUsInSame": "numa"},
    ]
    p = pool(topo, *types)
    rng = random.Random(len(topo.cpus))
    live: list[Member] = []
    exhausted = 0
    for step in range(400):
        if live and rng.random() < 0.4:
            gone = live.pop(rng.randrange(len(live)))
            p.release(gone.key)
        else:
            ns = rng.choice(["small", "big", "shared", "kube-system", "other"])
            m = member(f"p{step}", milli=rng.choice([0, 250, 500, 1000, 1500, 2000]), ns=ns)
            try:
                p.assign(m, choose_type(p.config, PodContext(ns, m.pod_name, "c")))
                live.append(m)
            except Exhausted:
                exhausted += 1
        check_invariants(p)
    assert {m.key for _, m in p.members()} == {m.key for m in live}
    if len(topo.cpus) <= 16:
        assert exhausted  # small machines do fill up


def test_max_cpus_and_max_balloons_exhaust_with_a_clear_reason() -> None:
    p = pool(Topology.synthetic(1, 1, 8, 1), {"name": "t", "namespaces": ["*"], "maxCPUs": 2, "maxBalloons": 2})
    p.assign(member("a", milli=1500), p.types["t"])
    p.assign(member("b", milli=2000), p.types["t"])
    balloon = p.assign(member("c", milli=400), p.types["t"])  # fits in a's balloon: 1900m -> 2 CPUs
    assert balloon.name == "t[0]" and len(balloon.cpus) == 2
    with pytest.raises(Exhausted, match="no balloon can take container default/pod-d/c .*maxBalloons 2, maxCPUs 2"):
        p.assign(member("d", milli=1000), p.types["t"])
    with pytest.raises(Exhausted):
        p.assign(member("e", milli=3000), p.types["t"])  # more than maxCPUs by itself


def test_no_free_cpus_exhausts_then_fallback_lands_in_default() -> None:
    p = pool(Topology.synthetic(1, 1, 4, 1), {"name": "t", "namespaces": ["*"]})
    p.assign(member("a", milli=3000), p.types["t"])  # all 3 non-reserved CPUs
    with pytest.raises(Exhausted):
        p.assign(member("b", milli=1000), p.types["t"])
    balloon = p.assign_fallback(member("b", milli=1000))
    assert balloon.name == "default[0]" and balloon.cpus == frozenset()
    assert p.effective_cpus(balloon) == p.reserved  # nowhere else to run
    check_invariants_without_size(p)


def check_invariants_without_size(p: Pool) -> None:
    owned: set[int] = set()
    for balloon in p.balloons:
        assert not balloon.cpus & owned
        owned |= balloon.cpus


def test_growth_and_shrink_follow_requests_within_min_and_max() -> None:
    p = pool(Topology.synthetic(1, 1, 8, 2), {"name": "t", "namespaces": ["*"], "minCPUs": 2, "maxCPUs": 5})
    t = p.types["t"]
    b = p.assign(member("a", "x", 500), t)
    assert len(b.cpus) == 2  # minCPUs
    p.assign(member("a", "y", 2500), t)
    assert len(b.cpus) == 3
    p.assign(member("a", "z", 1900), t)
    assert len(b.cpus) == 5
    with pytest.raises(Exhausted):
        p.assign(member("a", "w", 200), t)  # its pod's balloon is at maxCPUs
    p.release(("a", "y"))
    assert len(b.cpus) == 3
    p.release(("a", "x"))
    p.release(("a", "z"))
    assert b not in p.balloons  # empty and above minBalloons (0)


def test_prefer_new_balloons_gives_each_pod_its_own_balloon_and_keeps_pods_together() -> None:
    p = pool(Topology.synthetic(1, 1, 8, 1), {"name": "t", "namespaces": ["*"], "preferNewBalloons": True})
    t = p.types["t"]
    a1 = p.assign(member("a", "c1", 1000), t)
    a2 = p.assign(member("a", "c2", 1000), t)
    b1 = p.assign(member("b", "c1", 1000), t)
    assert a1 is a2 and a1 is not b1
    assert len(a1.cpus) == 2 and len(b1.cpus) == 1


def test_type_choice_follows_nri_order() -> None:
    p = pool(
        Topology.synthetic(1, 1, 4, 1),
        {"name": "lbl", "matchExpressions": [{"key": "pod/labels/app", "operator": "Equals", "values": ["db"]}]},
        {"name": "ns", "namespaces": ["team-*"]},
    )
    assert choose_type(p.config, PodContext("kube-system", "p", "c")).name == "reserved"
    # a namespace match wins over an earlier type's matchExpressions (NRI's order)
    assert choose_type(p.config, PodContext("team-b", "p", "c", {"app": "db"})).name == "ns"
    assert choose_type(p.config, PodContext("team-a", "p", "c", {"app": "db"})).name == "ns"
    assert choose_type(p.config, PodContext("x", "p", "c", {"app": "db"})).name == "lbl"
    assert choose_type(p.config, PodContext("x", "p", "c")).name == "default"
    assert choose_type(p.config, PodContext("kube-system", "p", "c", {}, {BALLOON_ANNOTATION: "lbl"})).name == "lbl"
    assert choose_type(p.config, PodContext("x", "p", "c", {}, {f"{BALLOON_ANNOTATION}/container.c": "ns"})).name == "ns"
    with pytest.raises(UnknownBalloonType, match="'nope'"):
        choose_type(p.config, PodContext("x", "p", "c", {}, {BALLOON_ANNOTATION: "nope"}))


def test_reserved_from_a_quantity_and_min_balloons_that_do_not_fit() -> None:
    topo = Topology.synthetic(1, 2, 4, 2)
    p = Pool(parse_config({"reservedResources": {"cpu": "2000m"}}), topo)
    assert len(p.reserved) == 2 and len({topo.cpus[c].core for c in p.reserved}) == 1
    with pytest.raises(PoolError, match="minBalloons 4 of minCPUs 4"):
        pool(topo, {"name": "t", "minBalloons": 4, "minCPUs": 4})
    with pytest.raises(PoolError, match="not online"):
        pool(topo, availableResources={"cpu": "cpuset:0-99"})


def test_shared_idle_cpus_stay_in_scope() -> None:
    topo = Topology.synthetic(1, 2, 4, 1)  # node 0: 0-3, node 1: 4-7
    p = pool(topo, {"name": "s", "namespaces": ["s"], "shareIdleCPUsInSame": "numa"}, {"name": "x", "namespaces": ["x"]})
    s = p.assign(member("a", milli=1000, ns="s"), p.types["s"])
    x = p.assign(member("b", milli=1000, ns="x"), p.types["x"])
    eff = p.effective_cpus(s)
    assert s.cpus <= eff and not eff & x.cpus and not eff & p.reserved
    assert topo.nodes_of(eff) == topo.nodes_of(s.cpus)
    assert p.effective_cpus(x) == x.cpus


def test_restore_rebuilds_balloons_from_cpusets_and_settles_sizes() -> None:
    topo = Topology.synthetic(1, 1, 8, 1)
    p = pool(topo, {"name": "t", "namespaces": ["*"]})
    t = p.types["t"]
    p.restore(member("a", "c1", 1000), t, frozenset({2, 3}))
    p.restore(member("a", "c2", 1000), t, frozenset({2, 3}))
    p.restore(member("b", "c1", 500), t, frozenset({5}))
    p.restore(member("k", "c1", 0, ns="kube-system"), p.types["reserved"], frozenset({0}))
    assert sorted(b.name for b in p.balloons) == ["reserved[0]", "t[0]", "t[1]"]
    assert p.settle() == []
    check_invariants(p)
    assert p.balloon_of(("a", "c1")).cpus == {2, 3}
    assert p.balloon_of(("b", "c1")).cpus == {5}


def test_settle_shrinks_before_it_grows() -> None:
    p = pool(Topology.synthetic(1, 1, 4, 1), {"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]})
    p.restore(member("b", milli=2000, ns="b"), p.types["b"], frozenset({3}))  # needs one more
    p.restore(member("a", milli=1000, ns="a"), p.types["a"], frozenset({1, 2}))  # holds one too many
    assert p.settle() == []
    check_invariants(p)


def test_settle_gives_a_balloon_it_cannot_size_what_is_free() -> None:
    # Running containers cannot be refused: each asks 3 CPUs of the 3 there
    # are; the one CPU free goes to one of them rather than to nobody.
    p = pool(Topology.synthetic(1, 1, 4, 1), {"name": "t", "namespaces": ["*"]})
    a = p.restore(member("a", milli=3000), p.types["t"], frozenset({1}))
    b = p.restore(member("b", milli=3000), p.types["t"], frozenset({2}))
    assert len(p.settle()) == 2
    assert not p.free and sorted([len(a.cpus), len(b.cpus)]) == [1, 2] and not a.cpus & b.cpus


def test_a_besteffort_member_gets_one_cpu_and_joins_without_growing_a_balloon() -> None:
    p = pool(Topology.synthetic(1, 1, 8, 1), {"name": "t", "namespaces": ["*"]})
    be = p.assign(member("a", milli=0), p.types["t"])
    assert len(be.cpus) == 1
    assert p.assign(member("a", "c2", milli=0), p.types["t"]) is be and len(be.cpus) == 1
    full = p.assign(member("b", milli=1000), p.types["t"])
    assert full is not be or len(full.cpus) == 1
    check_invariants(p)


def test_containers_of_a_cpu_less_balloon_restore_into_one_balloon() -> None:
    # Both ran on the reserved CPU because their balloon had no CPU of its own.
    p = pool(Topology.synthetic(1, 1, 4, 1), {"name": "t", "namespaces": ["*"], "maxBalloons": 1})
    first = p.restore(member("a", milli=0), p.types["t"], frozenset({0}))
    second = p.restore(member("b", milli=0), p.types["t"], frozenset({0}))
    assert first is second and first.cpus == frozenset()
    assert len(p.of_type("t")) == 1


def test_restore_beyond_max_balloons_leaves_the_container_to_be_placed_anew() -> None:
    """(restoring.rebuild then places it as a container not pinned yet: in a
    balloon with room, or on the fallback one.)"""
    p = pool(Topology.synthetic(1, 1, 8, 1), {"name": "t", "namespaces": ["*"], "maxBalloons": 1})
    p.restore(member("a"), p.types["t"], frozenset({1}))
    assert p.restore(member("b"), p.types["t"], frozenset({5})) is None
    balloon = p.assign(member("b"), p.types["t"])
    assert len(p.of_type("t")) == 1 and balloon.has_pod(member("b").pod_uid)
    assert p.settle() == []
    assert len(balloon.cpus) == 2


def test_prefer_new_balloons_restore_keeps_pods_that_shared_a_balloon() -> None:
    """c ran in a's balloon: assign() put it there (no new balloon could be
    made). d's CPU 3 is a's, but 6 is no balloon's yet (a move under way):
    with room for a balloon, d gets its own."""
    p = pool(Topology.synthetic(1, 1, 8, 1), {"name": "t", "namespaces": ["*"], "maxBalloons": 3, "preferNewBalloons": True})
    t = p.types["t"]
    a = p.restore(member("a"), t, frozenset({1, 2, 3}))
    assert p.restore(member("c"), t, frozenset({1, 2, 3})) is a
    b = p.restore(member("b"), t, frozenset({4, 5}))
    d = p.restore(member("d"), t, frozenset({3, 6}))
    assert len({id(a), id(b), id(d)}) == 3 and (a.cpus, b.cpus, d.cpus) == ({1, 2, 3}, {4, 5}, {6})


def test_restore_keeps_a_balloon_within_max_cpus() -> None:
    """b ran in a balloon of its own: its pod's, at maxCPUs, had no room for
    it (onExhausted: Ignore, or adopted). It joined its pod's all the same,
    beyond maxCPUs, and moved; a container asking more than maxCPUs (it ran
    on the default balloon) got a new balloon of its type, capped there."""
    p = pool(Topology.synthetic(1, 1, 8, 1), {"name": "t", "namespaces": ["*"], "maxCPUs": 2})
    t = p.types["t"]
    a = p.restore(member("P", "a", 2000), t, frozenset({1, 2}))
    b = p.restore(member("P", "b", 1000), t, frozenset({3}))
    assert b is not a and (a.cpus, b.cpus) == ({1, 2}, {3})
    assert p.restore(member("Q", milli=3000), t, frozenset({4, 5, 6})) is None


def test_a_split_pods_container_joins_its_pods_second_balloon_when_the_first_is_full() -> None:
    """Under Fail, work (maxCPUs 2) on 8 CPUs: a/c0 (2000m) fills work[0];
    a/c1 (500m), found running, cannot be refused and goes apart, to a new
    work[1]. a/c2 (500m) fits work[1] within maxCPUs: it joins it. It was
    refused, only the pod's first balloon, full, being tried."""
    p = pool(Topology.synthetic(1, 1, 8, 1), {"name": "work", "namespaces": ["apps"], "maxCPUs": 2})
    work = p.types["work"]
    assert p.assign(member("a", "c0", 2000, "apps"), work).name == "work[0]"
    assert p.assign_anyway(member("a", "c1", 500, "apps"), work).name == "work[1]"
    assert p.assign(member("a", "c2", 500, "apps"), work).name == "work[1]"
    assert sorted(p.balloon_of(("a", "c2")).members) == [("a", "c1"), ("a", "c2")]
    with pytest.raises(Exhausted, match=r"its pod's balloons work\[0\], work\[1\]"):
        p.assign(member("a", "c3", 1500, "apps"), work)
    check_invariants(p)
