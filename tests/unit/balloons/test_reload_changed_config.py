"""A reload of a changed config keeps what docs/hook-balloons.md promises."""

from __future__ import annotations

from hooks.balloons.config import parse_config
from hooks.balloons.topology import format_cpuset

from .test_restart_random import workload


def test_a_container_whose_type_a_reload_changed_takes_no_balloon_from_those_of_its_new_type() -> None:
    """Seed 645: 6 CPUs, 0-1 reserved; batch's p1/c1 on 2-3, work's p4/c1 on
    4 (work: maxBalloons 1, sharing its NUMA node's idle CPUs). Batch removed,
    p1/c1 is of type work: restored first, it made work's one balloon of 2-3,
    and p4/c1, its balloon's CPUs no longer work's, joined it there."""
    made = workload(645)
    assert made is not None
    doc, topology, state = made
    assert [(b.name, format_cpuset(b.cpus), sorted(b.members)) for b in state.pool.balloons[1:]] == [
        ("batch[0]", "2-3", [("p1", "c1")]), ("work[0]", "4", [("p4", "c1")])]
    config = parse_config({**doc, "balloonTypes": [t for t in doc["balloonTypes"] if t["name"] != "batch"]})
    again = state.replan(config, topology)
    work = again.pool.balloon_of(("p4", "c1"))
    assert work is not None and 4 in work.cpus and ("p1", "c1") in work.members


def test_a_balloon_with_own_cpus_left_gets_them_back_before_one_whose_cpus_a_reload_reserved() -> None:
    """Seed 1918: 4 CPUs, 0 reserved; work (maxBalloons 2) holds p4/c0 and
    p5/c1 on 1, and p6/c1 on 2-3. Reserving 1 and 3 left the first balloon
    no CPU: restored first, p4/c0 and p5/c1 each made a balloon (the type's
    two), and p6/c1, its balloon not restored, went to the default balloon,
    which no CPU was left for: CPU 2 was p5/c1's."""
    made = workload(1918)
    assert made is not None
    doc, topology, state = made
    assert [(b.name, format_cpuset(b.cpus), sorted(b.members)) for b in state.pool.balloons[1:]] == [
        ("work[0]", "1", [("p4", "c0"), ("p5", "c1")]), ("work[1]", "2-3", [("p6", "c1")])]
    again = state.replan(parse_config({**doc, "reservedResources": {"cpu": "cpuset:1,3"}}), topology)
    work = again.pool.balloon_of(("p6", "c1"))
    assert work is not None and work.btype.name == "work" and 2 in work.cpus
    assert again.pool.balloon_of(("p4", "c0")) is again.pool.balloon_of(("p5", "c1"))


def test_a_balloon_left_without_cpus_by_a_reload_takes_the_first_cpu_free() -> None:
    """Seed 1918, as above: work's balloon of 2-3, left 2, and the one of 1,
    left no CPU, are each one short, and one CPU, 0, is free. The first,
    restored first, took it: p4/c0 and p5/c1 ran on the reserved CPUs."""
    made = workload(1918)
    assert made is not None
    doc, topology, state = made
    again = state.replan(parse_config({**doc, "reservedResources": {"cpu": "cpuset:1,3"}}), topology)
    assert [(format_cpuset(b.cpus), sorted(b.members)) for b in again.pool.balloons[1:]] == [
        ("2", [("p6", "c1")]), ("0", [("p4", "c0"), ("p5", "c1")])]
