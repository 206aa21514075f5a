"""A restart's reserved CPUs given as a quantity, where balloons share idle
CPUs: what the containers run on does not tell idle CPUs from reserved
ones, but a CPU in the scope of a container sharing idle CPUs that it does
not run on is not idle, and one it shares is. A reserved CPU goes offline
and back, so the CPU reserved since is another: the restart keeps that
one and moves no container (with no reserved container, of those below).
Machines as in test_hotplug (CPUs 0-3 on NUMA node 0, 4-7 on node 1), and
the random ones of test_restart_random. A restart with a changed config
(docs/hook-balloons.md, Reserved CPUs kept) last. Each deduced, and with
the reserved set saved (stateDir: test_saved_reserved), which keeps it
where the deduction cannot.
"""

from __future__ import annotations

import random
from dataclasses import field, fields, make_dataclass, replace
from pathlib import Path
from typing import Any

from hooks.balloons import restoring
from hooks.balloons.balloon import Member
from hooks.balloons.config import RESERVED, BalloonsConfig, BalloonType, PodContext, parse_config
from hooks.balloons.planning import Restored
from hooks.balloons.pool import PoolError
from hooks.balloons.savedreserved import SavedReserved, fingerprint, judge
from hooks.balloons.server import BalloonsHook
from hooks.balloons.state import Assignments
from hooks.balloons.topology import Topology, format_cpuset, parse_cpuset

from .test_hotplug import balloons, hook_on_sysfs, set_online
from .test_reload_changed_config import changed
from .test_replan import restarted, running
from .test_restart_random import found, workloads
from .test_server import request


async def cpu_0_offline_and_back(tmp_path: Path, config: dict[str, Any], pods: list[tuple[str, str]],
                                 **options: Any) -> tuple[BalloonsHook, Path]:
    """The hook on ``config`` (``options``: BalloonsHook's), ``pods`` (uid,
    namespace) placed, then CPU 0 offline and back, every move done."""
    hook, _, root = await hook_on_sysfs(tmp_path, config, **options)
    for uid, ns in pods:
        await hook.pre_create_container(request(uid, "app", ns=ns, shares=1024))
        await hook.pre_start_container(request(uid, "app", ns=ns, cid=f"c-{uid}"))
    for online in ("1-7", "0-7"):
        set_online(root, online)
        await hook.reconcile()
        assert await hook.apply_moves()
    return hook, root


async def test_a_reserved_cpu_in_the_numa_node_whose_idle_cpus_a_balloon_shares_stays_reserved(tmp_path) -> None:
    """1 is reserved since; a's balloon on 2 shares node 0's idle CPUs
    (0,2-3), dns every idle CPU (0-1,3-7). 1 is not idle, or a would run on
    it: it stays reserved. The restart, unable to tell 1 from the idle CPUs
    of node 1 that dns alone runs on, reserved the most compact of these,
    4, and moved a onto 1, idle then."""
    config = {"reservedResources": {"cpu": "1"}, "balloonTypes": [
        {"name": "work", "namespaces": ["apps"], "shareIdleCPUsInSame": "numa"},
        {"name": "reserved", "shareIdleCPUsInSame": "system"}]}
    hook, root = await cpu_0_offline_and_back(tmp_path, config, [("a", "apps"), ("dns", "kube-system")])
    assert (hook.status()["reserved_cpus"], balloons(hook)) == ("1", [("reserved[0]", "1", ["c-dns"]), ("work[0]", "2", ["c-a"])])
    assert {c.container_id: format_cpuset(c.cpus) for c in running(hook)} == {"c-dns": "0-1,3-7", "c-a": "0,2-3"}
    again, runtime = await restarted(hook, tmp_path, root, config)
    assert (again.status()["reserved_cpus"], runtime.updates) == ("1", [])
    assert balloons(again) == balloons(hook)


async def test_with_no_reserved_container_a_restart_does_not_reserve_an_idle_cpu_balloons_share(tmp_path) -> None:
    """4 is reserved since; a and b, on 1 and 2, share node 0's idle CPUs,
    0 among them. The first start's pick, 0, is not taken: containers run on
    it. It was (no container runs on it as its balloon's own): a and b moved."""
    config = {"reservedResources": {"cpu": "1"}, "balloonTypes": [
        {"name": "work", "namespaces": ["apps"], "preferNewBalloons": True, "shareIdleCPUsInSame": "numa"}]}
    hook, root = await cpu_0_offline_and_back(tmp_path, config, [("a", "apps"), ("b", "apps")])
    assert (hook.status()["reserved_cpus"], balloons(hook)[1:]) == ("4", [("work[0]", "1", ["c-a"]), ("work[1]", "2", ["c-b"])])
    assert {c.container_id: format_cpuset(c.cpus) for c in running(hook)} == {"c-a": "0-1,3", "c-b": "0,2-3"}
    again, runtime = await restarted(hook, tmp_path, root, config)
    assert (again.status()["reserved_cpus"], runtime.updates) == ("4", [])
    assert balloons(again) == balloons(hook)


def saved_restart(config: BalloonsConfig, before: Assignments, running: list[Restored]) -> Assignments:
    """A restart on ``config`` of ``running``, ``before``'s reserved CPUs
    saved under its config, as the hook's (StartFiles.restart, savedstart.py): judged
    consistent with what runs (they are: SavedReservedError otherwise)."""
    saved = SavedReserved(before.pool.reserved, fingerprint(before.config))
    return restoring.rebuild(config, before.topology, running, judge(config, before.topology, running, saved))


def test_a_restart_after_hotplug_moved_the_reserved_cpus_moves_no_container_of_another_type() -> None:
    """The random workloads of test_restart_random (seeds 0-2999) whose
    reserved type shares idle CPUs: each reserved CPU taken offline and
    back, every move done, then a restart, where the hotplug moved the
    reserved CPUs and reserved containers run (591 runs). The restart
    moved containers of other types in 80 (seeds 61, 122, 135, 244, ...),
    reserving CPUs they shared as idle or making idle one they did not.
    Deduced, the reserved CPUs still change in 405 (the idle CPUs the
    reserved containers alone share cannot be told from the reserved
    ones); saved, in none, and no container moves."""
    moved, changed_deduced, changed_saved, moved_saved, runs = [], [], [], [], 0
    for seed, doc, topology, state in workloads(seeds=range(3000)):
        config = parse_config(doc)
        if not config.types_by_name[RESERVED].share_idle_cpus_in_same:
            continue
        for cpu in sorted(state.pool.reserved):
            try:
                back = state
                for online in (Topology({c: i for c, i in topology.cpus.items() if c != cpu}), topology):
                    back = restoring.replan(back, config, online)
                    for move in back.moves():
                        back.moved(move)
            except PoolError:
                continue
            if back.pool.reserved == state.pool.reserved or not back.pool.balloons[0].members:
                continue
            runs += 1
            again = restoring.rebuild(config, topology, found(back), None)
            if any(again.pool.balloon_of(m.key).btype.name != RESERVED for m in again.moves()):
                moved.append((seed, cpu))
            if again.pool.reserved != back.pool.reserved:
                changed_deduced.append((seed, cpu))
            again = saved_restart(config, back, found(back))
            if again.pool.reserved != back.pool.reserved:
                changed_saved.append((seed, cpu))
            if again.moves():
                moved_saved.append((seed, cpu))
    assert (moved, changed_saved, moved_saved) == ([], [], [])
    assert runs > 100 and changed_deduced, (runs, changed_deduced)


def test_a_restart_with_a_changed_config_keeps_the_saved_reserved_cpus_as_a_reload_does() -> None:
    """The random workloads of test_restart_random (seeds 0-1499), each
    restarted on a config with one to three of test_reload_changed_config's
    random changes, the reserved CPUs given as a quantity before and after.
    With the set saved, the restart reserves the CPUs a reload of the
    changed config keeps, in every run (1251); deduced, it does not in 91
    (seeds 7, 14, 30, ...): the reserved type's containers are others
    (reservedPoolNamespaces), the available CPUs or the scopes changed
    (docs/hook-balloons.md, Reserved CPUs kept)."""
    deduced_differ, saved_differ, runs = [], [], 0
    for seed, doc, topology, state in workloads(seeds=range(1500)):
        new, what = changed(doc, random.Random(seed), topology)
        config = parse_config(new)
        if config.reserved_cpuset is not None:
            continue
        running = found(state)
        try:
            reload = restoring.replan(state, config, topology)
            deduced = restoring.rebuild(config, topology, running, None)
        except PoolError:
            continue
        runs += 1
        if deduced.pool.reserved != reload.pool.reserved:
            deduced_differ.append((seed, what))
        if saved_restart(config, state, running).pool.reserved != reload.pool.reserved:
            saved_differ.append((seed, what))
    assert saved_differ == []
    assert runs > 700 and deduced_differ, (runs, deduced_differ)


def _reserved_at_restart(doc: dict[str, Any], topology: Topology, cpusets: dict[str, tuple[str, str]]) -> str:
    """The reserved CPUs a restart on ``doc`` keeps, each pod (uid: its
    namespace and cpuset) found running one container on that cpuset."""
    found = [Restored(Member((uid, "c"), ns, uid, 100, f"id-{uid}"), PodContext(ns, uid, "c"), parse_cpuset(cpus))
             for uid, (ns, cpus) in cpusets.items()]
    return format_cpuset(restoring.rebuild(parse_config(doc), topology, found, None).pool.reserved)


def test_a_restart_whose_config_shares_idle_cpus_in_a_wider_scope_keeps_the_reserved_cpus() -> None:
    """1 reserved CPU, 0, on CPUs 0-3 (node 0) and 4-7 (node 1); dns on the
    reserved and idle CPUs (0,5-7), batch on 1-3, work's a on 4 sharing no
    idle CPU. Restarted with work sharing them in its NUMA node, 5-7 look
    reserved (in a's scope, not in its cpuset): three told for one reserved.
    The first start's pick, 0, which dns runs on, stays. It reserved 5."""
    doc: dict[str, Any] = {"reservedResources": {"cpu": "1"}, "balloonTypes": [
        {"name": "batch", "namespaces": ["batch"]}, {"name": "work", "namespaces": ["apps"]},
        {"name": "reserved", "shareIdleCPUsInSame": "system"}]}
    topology = Topology.synthetic(1, 2, 4, 1)
    running_on = {"dns": ("kube-system", "0,5-7"), "b": ("batch", "1-3"), "a": ("apps", "4")}
    assert _reserved_at_restart(doc, topology, running_on) == "0"
    work = {"name": "work", "namespaces": ["apps"], "shareIdleCPUsInSame": "numa"}
    changed = {**doc, "balloonTypes": [doc["balloonTypes"][0], work, doc["balloonTypes"][2]]}
    assert _reserved_at_restart(changed, topology, running_on) == "0"


def test_a_restart_with_fewer_reserved_cpus_takes_the_first_starts_pick_where_reserved_containers_run() -> None:
    """Cores {0,4} {1,5} on node 0, {2,6} {3,7} on node 1; 2 reserved CPUs,
    2 and 6 since a hotplug; a (work) on 3,7 shares its node's idle CPUs
    (none), b (batch) on 1,5, dns on the reserved and idle CPUs (0,2,4,6).
    Restarted with 1 reserved CPU: 2 and 6 are told reserved, more than
    asked. As with none told, the first start's pick, 0, which dns runs on,
    is taken (a reload keeps it where the reserved CPUs before hold it). It
    took 2, the most compact part of those told; it still does when dns
    does not run on 0."""
    doc: dict[str, Any] = {"reservedResources": {"cpu": "1"}, "balloonTypes": [
        {"name": "batch", "namespaces": ["batch"]},
        {"name": "work", "namespaces": ["apps"], "shareIdleCPUsInSame": "numa"},
        {"name": "reserved", "shareIdleCPUsInSame": "system"}]}
    topology = Topology.synthetic(1, 2, 2, 2)
    running_on = {"dns": ("kube-system", "0,2,4,6"), "b": ("batch", "1,5"), "a": ("apps", "3,7")}
    assert _reserved_at_restart(doc, topology, running_on) == "0"
    assert _reserved_at_restart(doc, topology, {**running_on, "dns": ("kube-system", "2,6")}) == "2"


SHARING_IDLE = {"reservedResources": {"cpu": "1"}, "balloonTypes": [
    {"name": "work", "namespaces": ["apps"]}, {"name": "reserved", "shareIdleCPUsInSame": "system"}]}


def test_a_key_a_later_version_adds_at_its_default_leaves_the_fingerprint_as_it_was() -> None:
    """An upgrade adding a key, to the config or a balloon type: a config
    not setting it keeps its fingerprint, so the first restart after the
    upgrade judges the saved set under its config (before: every field
    hashed, every fingerprint changed)."""
    config = parse_config(SHARING_IDLE)
    later_config = make_dataclass("LaterConfig", [("new_key", int, field(default=0))], bases=(BalloonsConfig,), frozen=True)
    later_type = make_dataclass("LaterType", [("new_key", str, field(default=""))], bases=(BalloonType,), frozen=True)
    types = tuple(later_type(**{f.name: getattr(t, f.name) for f in fields(BalloonType)}) for t in config.balloon_types)
    later = later_config(**{f.name: getattr(config, f.name) for f in fields(BalloonsConfig)})
    assert fingerprint(later) == fingerprint(replace(later, balloon_types=types)) == fingerprint(config)
    assert fingerprint(replace(later, new_key=1)) != fingerprint(config)
    assert fingerprint(replace(later, balloon_types=(replace(types[0], new_key="x"), *types[1:]))) != fingerprint(config)
    assert fingerprint(parse_config({**SHARING_IDLE, "balloonTypes": [{**SHARING_IDLE["balloonTypes"][0], "maxCPUs": 2}]})) != fingerprint(config)
