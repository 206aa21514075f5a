"""The CPU picker on synthetic machines: compact growth, compact shrink."""

from __future__ import annotations

import pytest

from hooks.balloons import allocator
from hooks.balloons.topology import (
    Topology,
    format_cpuset,
    parse_cpuset,
    write_synthetic_sysfs,
)

# (packages, NUMA nodes per package, cores per node, threads per core)
SHAPES = {
    "1node-4cores": (1, 1, 4, 1),
    "1node-4cores-ht": (1, 1, 4, 2),
    "2nodes-16cores-ht": (1, 2, 8, 2),
    "2packages-16cores": (2, 1, 8, 1),
    "4nodes-64cores": (4, 1, 16, 1),
    "4nodes-256cpus-ht": (2, 2, 32, 2),
}


def shape(name: str) -> Topology:
    return Topology.synthetic(*SHAPES[name])


def test_cpuset_format_both_ways() -> None:
    assert parse_cpuset("0-3,8, 10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert format_cpuset({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert parse_cpuset("") == frozenset() and format_cpuset([]) == ""
    with pytest.raises(ValueError):
        parse_cpuset("3-1")
    with pytest.raises(ValueError, match="past 65535"):
        parse_cpuset("0-4000000000")  # a typo: refused at once, not a set of four billion
    assert len(parse_cpuset("0-65535")) == 1 << 16


@pytest.mark.parametrize("name", SHAPES)
def test_sysfs_reader_reads_what_was_written(tmp_path, name) -> None:
    topo = shape(name)
    write_synthetic_sysfs(tmp_path, topo)
    read = Topology.from_sysfs(tmp_path)
    assert read.all_cpus == topo.all_cpus
    for cpu in topo.cpus:
        assert read.siblings(cpu) == topo.siblings(cpu)
        assert read.cpus[cpu].node == topo.cpus[cpu].node
        assert read.cpus[cpu].package == topo.cpus[cpu].package


def test_a_new_balloon_takes_whole_cores() -> None:
    topo = shape("1node-4cores-ht")  # cores: {0,4} {1,5} {2,6} {3,7}
    assert allocator.take(topo, topo.all_cpus, 2) == {0, 4}
    assert allocator.take(topo, topo.all_cpus, 4) == {0, 1, 4, 5}
    assert allocator.take(topo, topo.all_cpus, 3) == {0, 4, 1}


def test_one_cpu_goes_to_a_lone_free_thread_rather_than_splitting_a_free_core() -> None:
    topo = shape("1node-4cores-ht")
    free = topo.all_cpus - {0}  # core {0,4} is half used by someone else
    assert allocator.take(topo, free, 1) == {4}


def test_growth_completes_own_cores_then_stays_in_its_numa_node() -> None:
    topo = shape("2nodes-16cores-ht")  # node 0: cores 0-7 (cpus 0-7, 16-23); node 1: cores 8-15
    have = frozenset({8})
    more = allocator.take(topo, topo.all_cpus - have, 3, near=have)
    assert 24 in more  # the sibling of cpu 8 first
    assert topo.nodes_of(more | have) == {1}


def test_a_new_balloon_goes_to_the_node_it_fits_most_tightly() -> None:
    topo = shape("2nodes-16cores-ht")
    node0, node1 = topo.node_cpus[0], topo.node_cpus[1]
    free = (node0 - set(sorted(node0)[:10])) | node1  # node 0 has 6 free, node 1 has 16
    got = allocator.take(topo, free, 4)
    assert topo.nodes_of(got) == {0}
    got = allocator.take(topo, free, 8)
    assert topo.nodes_of(got) == {1}


def test_a_balloon_larger_than_a_node_spans_the_fewest_nodes_in_one_package() -> None:
    topo = shape("4nodes-256cpus-ht")  # 64 CPUs per node, 2 nodes per package
    got = allocator.take(topo, topo.all_cpus, 100)
    assert len(got) == 100
    assert len(topo.nodes_of(got)) == 2
    assert len({topo.cpus[c].package for c in got}) == 1
    # whole cores: at most one half-used core
    halves = [core for core, cpus in topo.core_cpus.items() if len(cpus & got) == 1]
    assert len(halves) == 0


def test_take_refuses_more_than_free() -> None:
    topo = shape("1node-4cores")
    assert allocator.take(topo, {1, 2}, 3) is None
    assert allocator.take(topo, {1, 2}, 0) == frozenset()


def test_give_back_releases_lone_threads_and_the_least_used_node_first() -> None:
    topo = shape("2nodes-16cores-ht")
    owned = frozenset({0, 16, 1, 17, 2, 8})  # node 0: cores 0 and 1 whole, a lone 2; node 1: lone 8
    assert allocator.give_back(topo, owned, 1) == {8}
    assert allocator.give_back(topo, owned, 2) == {8, 2}
    kept = owned - allocator.give_back(topo, owned, 4)
    assert len(kept) == 2 and len({topo.cpus[c].core for c in kept}) == 1


# Reserved CPUs given as a quantity: node 0 is CPUs 0-3, node 1 is 4-7.
# Containers run on 1-2 and 4-6 (``avoid``); 3 and 7 are idle.
BUSY = frozenset({1, 2, 4, 5, 6})


def test_reserve_without_a_set_before_is_a_compact_fresh_pick() -> None:
    topo = Topology.synthetic(1, 2, 4, 1)
    assert allocator.reserve(topo, topo.all_cpus, 2) == allocator.take(topo, topo.all_cpus, 2) == {0, 1}
    assert allocator.reserve(topo, {0, 1}, 3) is None


def test_reserve_keeps_the_set_before_and_tops_it_up_from_idle_cpus() -> None:
    topo = Topology.synthetic(1, 2, 4, 1)
    assert allocator.reserve(topo, topo.all_cpus, 1, keep={0}, avoid=BUSY) == {0}
    # CPU 8 is not available (offline): dropped; 3 and 7 are the idle ones.
    assert allocator.reserve(topo, topo.all_cpus, 3, keep={0, 8}, avoid=BUSY) == {0, 3, 7}


def test_reserve_keeps_the_most_compact_part_of_a_larger_set_before() -> None:
    topo = Topology.synthetic(1, 2, 4, 1)
    # Fewer reserved now: the lone CPU on node 1 goes, busy or not.
    assert allocator.reserve(topo, topo.all_cpus, 2, keep={0, 1, 5}, avoid=BUSY) == {0, 1}


def test_reserve_of_fewer_keeps_the_fresh_pick_when_within_the_set_before() -> None:
    """A reload from 4 reserved to 2, CPU 7 not available: the fresh pick,
    4-5 (node 1 fits 2 most tightly), not the most compact part, 0-1."""
    topo = Topology.synthetic(1, 2, 4, 1)
    keep = frozenset({0, 1, 4, 5})
    assert keep - allocator.give_back(topo, keep, 2) == {0, 1}
    assert allocator.reserve(topo, range(7), 2, keep=keep) == allocator.take(topo, range(7), 2) == {4, 5}


def test_reserve_takes_every_idle_cpu_then_the_fewest_busy_ones() -> None:
    """One idle CPU short: all the idle ones and one busy one, nearest the
    kept CPUs (node 0), not a compact pick among every CPU (1 and 2 both busy)."""
    topo = Topology.synthetic(1, 2, 4, 1)
    got = allocator.reserve(topo, topo.all_cpus, 4, keep={0}, avoid=BUSY)
    assert got == {0, 1, 3, 7}
    # No set before: the idle 6-7 and a busy CPU next to them.
    assert allocator.reserve(topo, topo.all_cpus, 3, avoid={0, 1, 2, 3, 4, 5}) == {4, 6, 7}
    assert allocator.reserve(topo, topo.all_cpus, 9, keep={0}, avoid=BUSY) is None


@pytest.mark.parametrize("name", SHAPES)
def test_repeated_takes_never_hand_out_a_cpu_twice(name) -> None:
    topo = shape(name)
    free = set(topo.all_cpus)
    seen: set[int] = set()
    size = 1
    while True:
        got = allocator.take(topo, free, size)
        if got is None:
            assert len(free) < size
            break
        assert len(got) == size and got <= free and not got & seen
        seen |= got
        free -= got
        size = size % 5 + 1
