"""Balloons short of the CPUs their containers request (none was free for
them): a container its type cannot take in full and that is not refused (a
running one reconcile adopts, any under onExhausted: Ignore) joins its pod's
balloon of its type rather than the default one, and a short balloon grows
as soon as CPUs are free again, not only when its members change. Machines
as in test_hotplug: CPUs 0-3 on NUMA node 0, 4-7 on node 1.
"""

from __future__ import annotations

import logging

import pytest

from cri_api.hookapi import api_pb2
from hooks.balloons import restoring
from hooks.balloons.balloon import Member, milli_from_shares
from hooks.balloons.config import PodContext, parse_config
from hooks.balloons.planning import Restored
from hooks.balloons.pool import Pool
from hooks.balloons.runtime import ExitedContainer, FoundContainer
from hooks.balloons.server import BalloonsHook
from hooks.balloons.state import Assignments
from hooks.balloons.topology import Topology, format_cpuset, parse_cpuset

from .test_hotplug import WORK, hook_on_sysfs, set_online
from .test_replan import balloons
from .test_restart_random import found
from .test_server import FakeRuntime, request

# One balloon of work, no maxCPUs: pod a's 7 CPUs fill the machine.
ONE = {"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "work", "namespaces": ["*"], "maxBalloons": 1}]}


async def b_left_without_cpus(hook: BalloonsHook, runtime: FakeRuntime, root) -> None:
    """Pod a on 1-3, pod b on 4-7; 4-7 go offline: b, placed anew, finds no
    CPU free and takes a balloon of its type that gets none (b runs on the
    reserved CPU 0): work has room for a second balloon (it went to the
    default balloon, away from its type)."""
    for uid, shares in (("a", 3 * 1024), ("b", 4 * 1024)):
        await hook.pre_create_container(request(uid, "app", shares=shares))
        await hook.pre_start_container(request(uid, "app", cid=f"c-{uid}"))
    assert await hook.apply_moves()
    assert balloons(hook)[1:] == [("work[0]", "1-3", ["c-a"]), ("work[1]", "4-7", ["c-b"])]
    set_online(root, "0-3")
    await hook.reconcile()
    assert await hook.apply_moves()
    assert balloons(hook)[1:] == [("work[0]", "1-3", ["c-a"]), ("work[1]", "", ["c-b"])]
    assert runtime.updates[-1] == ("c-b", "0", "0")


async def test_a_balloon_left_without_cpus_grows_when_another_balloon_goes(tmp_path, caplog) -> None:
    hook, runtime, root = await hook_on_sysfs(tmp_path)
    await b_left_without_cpus(hook, runtime, root)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await hook.post_stop_pod_sandbox(api_pb2.PodSandboxHookRequest(pod_meta=api_pb2.PodSandboxMetadata(uid="a")))
        assert await hook.apply_moves()
    # As far as CPUs are free: 3 of the 4 b requests.
    assert balloons(hook)[1:] == [("work[1]", "1-3", ["c-b"])]
    assert runtime.updates[-1] == ("c-b", "1-3", "0")
    assert "balloon work[1]" in caplog.text and "grows from the CPUs free now to 3 of the 4 CPUs" in caplog.text


async def test_a_balloon_left_without_cpus_grows_when_another_one_shrinks(tmp_path) -> None:
    """a's request drops from 3 CPUs to 1 (an in-place resize): 2 CPUs go to b."""
    hook, runtime, root = await hook_on_sysfs(tmp_path)
    await b_left_without_cpus(hook, runtime, root)
    await hook.pre_update_container_resources(request("a", "app", shares=1024, cid="c-a"))
    assert await hook.apply_moves()
    assert balloons(hook)[1:] == [("work[0]", "1", ["c-a"]), ("work[1]", "2-3", ["c-b"])]
    assert runtime.updates[-1] == ("c-b", "2-3", "0")


async def test_a_running_container_reconcile_adopts_joins_its_pods_balloon_though_it_cannot_grow(tmp_path, caplog) -> None:
    """Refused under onExhausted: Fail, it went to the default balloon (no
    CPU of its own: the reserved one) and was moved there, away from its pod."""
    hook, runtime, _ = await hook_on_sysfs(tmp_path, ONE)
    await hook.pre_create_container(request("a", "app", shares=7 * 1024))
    await hook.pre_start_container(request("a", "app", cid="c-a"))
    runtime.live = [
        FoundContainer("c-a", ("a", "app"), PodContext("apps", "pod-a", "app"), "a", frozenset(range(1, 8)), "0-1", 7 * 1024),
        FoundContainer("c-s", ("a", "side"), PodContext("apps", "pod-a", "side"), "a", frozenset(range(1, 8)), "0-1", 1024),
    ]
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await hook.reconcile()
    assert balloons(hook)[1:] == [("work[0]", "1-7", ["c-a", "c-s"])]
    assert "adopting running container apps/pod-a/side into balloon work[0]" in caplog.text
    assert "(its balloon type cannot take it in full)" in caplog.text
    assert await hook.apply_moves() and runtime.updates == []  # it runs on its balloon's CPUs already


async def test_a_pods_container_its_balloon_cannot_grow_for_joins_it_under_ignore(tmp_path) -> None:
    """Rather than the default balloon, without any CPU (the reserved one),
    apart from its pod."""
    hook, _, _ = await hook_on_sysfs(tmp_path, {**ONE, "onExhausted": "Ignore"})
    await hook.pre_create_container(request("a", "app", shares=7 * 1024))
    answer = await hook.pre_create_container(request("a", "side", shares=1024))
    assert answer.container_resources.cpuset_cpus == "1-7"
    assert balloons(hook)[1:] == [("work[0]", "1-7", ["", ""])]
    # Another pod still goes to the default balloon: work has no room for a balloon of its own.
    answer = await hook.pre_create_container(request("b", "app", shares=1024))
    assert answer.container_resources.cpuset_cpus == "0"
    assert balloons(hook)[2][0] == "default[0]"


# -- a refused PreCreateContainer, retried once the pod's exited containers are released


async def y_short_x_init(hook: BalloonsHook, runtime: FakeRuntime) -> None:
    """Pod x's init container on work[0] 1-2, pod y's app on work[1] 3-7,
    and y's side container, adopted, in y's balloon: one CPU short."""
    await hook.pre_create_container(request("x", "init", shares=2 * 1024))
    await hook.pre_start_container(request("x", "init", cid="c-xi"))
    await hook.pre_create_container(request("y", "app", shares=5 * 1024))
    await hook.pre_start_container(request("y", "app", cid="c-ya"))
    pod = lambda uid, name: PodContext("apps", f"pod-{uid}", name)  # noqa: E731
    runtime.live = [
        FoundContainer("c-xi", ("x", "init"), pod("x", "init"), "x", frozenset({1, 2}), "0", 2 * 1024),
        FoundContainer("c-ya", ("y", "app"), pod("y", "app"), "y", frozenset(range(3, 8)), "0-1", 5 * 1024),
        FoundContainer("c-ys", ("y", "side"), pod("y", "side"), "y", frozenset(range(1, 8)), "0-1", 1024),
    ]
    await hook.reconcile()
    assert balloons(hook)[1:] == [("work[0]", "1-2", ["c-xi"]), ("work[1]", "3-7", ["c-ya", "c-ys"])]
    runtime.live = runtime.live[1:]  # x's init container exits
    runtime.exited = [ExitedContainer("c-xi", ("x", "init"))]


async def test_a_refused_container_is_placed_on_retry_though_a_balloon_is_short(tmp_path) -> None:
    """x's app, refused while x's exited init container still counts, is
    placed on its CPUs once it is released; the CPU it leaves goes to y's
    balloon after. The release gave both to y's balloon first: the retry
    was refused again."""
    hook, runtime, _ = await hook_on_sysfs(tmp_path)
    await y_short_x_init(hook, runtime)
    answer = await hook.pre_create_container(request("x", "app", shares=1024))
    assert answer.container_resources.cpuset_cpus == "1"
    assert balloons(hook)[1:] == [("work[1]", "2-7", ["c-ya", "c-ys"]), ("work[0]", "1", [""])]


async def test_a_new_attempt_refused_leaves_its_previous_attempts_cpus_to_the_retry(tmp_path) -> None:
    """x's app was created (its stop unseen) with 1 CPU next to x's init
    container: work[0] 1-3. A new attempt of it asks for 3: refused at
    first, placed on 1-3 once the init container is released. Its previous
    attempt's CPU went to y's short balloon before the refusal: too few left."""
    hook, runtime, _ = await hook_on_sysfs(tmp_path)
    await hook.pre_create_container(request("x", "init", shares=2 * 1024))
    await hook.pre_start_container(request("x", "init", cid="c-xi"))
    await hook.pre_create_container(request("x", "app", shares=1024))
    await hook.pre_create_container(request("y", "app", shares=4 * 1024))
    await hook.pre_start_container(request("y", "app", cid="c-ya"))
    pod = lambda uid, name: PodContext("apps", f"pod-{uid}", name)  # noqa: E731
    runtime.live = [
        FoundContainer("c-xi", ("x", "init"), pod("x", "init"), "x", frozenset({1, 2, 3}), "0", 2 * 1024),
        FoundContainer("c-ya", ("y", "app"), pod("y", "app"), "y", frozenset(range(4, 8)), "1", 4 * 1024),
        FoundContainer("c-ys", ("y", "side"), pod("y", "side"), "y", frozenset(range(1, 8)), "0-1", 1024),
    ]
    await hook.reconcile()
    assert balloons(hook)[1:] == [("work[0]", "1-3", ["", "c-xi"]), ("work[1]", "4-7", ["c-ya", "c-ys"])]
    runtime.live = runtime.live[1:]  # x's init container exits
    runtime.exited = [ExitedContainer("c-xi", ("x", "init"))]
    answer = await hook.pre_create_container(request("x", "app", shares=3 * 1024))
    assert answer.container_resources.cpuset_cpus == "1-3"


async def test_a_retried_container_is_answered_what_it_runs_on_after_short_balloons_grew(tmp_path) -> None:
    """x's app, refused while x's exited init container (1-3) still counts,
    takes 1 on retry, and shares the idle 2-3 (shareIdleCPUsInSame). It was
    answered those before y's short balloon took 2 from them: its answer
    named a CPU y's balloon owns."""
    work = {"name": "work", "namespaces": ["*"], "shareIdleCPUsInSame": "system", "preferNewBalloons": True}
    hook, runtime, _ = await hook_on_sysfs(tmp_path, {**ONE, "balloonTypes": [work]})
    await hook.pre_create_container(request("x", "init", shares=3 * 1024))
    await hook.pre_start_container(request("x", "init", cid="c-xi"))
    await hook.pre_create_container(request("y", "app", shares=4 * 1024))
    await hook.pre_start_container(request("y", "app", cid="c-ya"))
    pod = lambda uid, name: PodContext("apps", f"pod-{uid}", name)  # noqa: E731
    runtime.live = [
        FoundContainer("c-xi", ("x", "init"), pod("x", "init"), "x", frozenset({1, 2, 3}), "0", 3 * 1024),
        FoundContainer("c-ya", ("y", "app"), pod("y", "app"), "y", frozenset(range(4, 8)), "1", 4 * 1024),
        FoundContainer("c-ys", ("y", "side"), pod("y", "side"), "y", frozenset(range(1, 8)), "0-1", 1024),
    ]
    await hook.reconcile()
    assert balloons(hook)[1:] == [("work[0]", "1-3", ["c-xi"]), ("work[1]", "4-7", ["c-ya", "c-ys"])]
    runtime.live = runtime.live[1:]  # x's init container exits
    runtime.exited = [ExitedContainer("c-xi", ("x", "init"))]
    answer = await hook.pre_create_container(request("x", "app", shares=1024))
    assert balloons(hook)[1:] == [("work[1]", "2,4-7", ["c-ya", "c-ys"]), ("work[0]", "1", [""])]
    assert answer.container_resources.cpuset_cpus == "1,3"


# -- as far as CPUs are free: a balloon takes those there are, not all or none


async def test_a_pods_container_joining_a_short_balloon_takes_the_cpus_free(tmp_path) -> None:
    """a's 5 CPUs leave 2-3 free; a's side container asks for 3 more: its
    balloon takes 2-3 rather than staying on 1,4-7 (and moving both
    containers at the next grow)."""
    hook, _, _ = await hook_on_sysfs(tmp_path, {**ONE, "onExhausted": "Ignore"})
    answer = await hook.pre_create_container(request("a", "app", shares=5 * 1024))
    assert answer.container_resources.cpuset_cpus == "1,4-7"
    answer = await hook.pre_create_container(request("a", "side", shares=3 * 1024))
    assert answer.container_resources.cpuset_cpus == "1-7"


async def test_the_default_balloon_takes_the_cpus_free_for_a_container_its_type_cannot_take(tmp_path) -> None:
    """Made for b (3 CPUs asked, 2 free) it gets those 2, not none (the
    reserved CPU); joined by c it grows by as many as are free."""
    config = {**ONE, "onExhausted": "Ignore"}
    hook, _, _ = await hook_on_sysfs(tmp_path, config)
    await hook.pre_create_container(request("a", "app", shares=5 * 1024))
    answer = await hook.pre_create_container(request("b", "app", shares=3 * 1024))
    assert answer.container_resources.cpuset_cpus == "2-3"
    assert balloons(hook)[2] == ("default[0]", "2-3", [""])
    hook, _, _ = await hook_on_sysfs(tmp_path / "joined", {**config, "balloonTypes": [{**ONE["balloonTypes"][0], "maxCPUs": 4}]})
    await hook.pre_create_container(request("a", "app", shares=4 * 1024))
    answer = await hook.pre_create_container(request("b", "app", shares=1024))
    assert answer.container_resources.cpuset_cpus == "1"
    answer = await hook.pre_create_container(request("c", "app", shares=3 * 1024))
    assert answer.container_resources.cpuset_cpus == "1-3"


# -- within maxCPUs


@pytest.mark.parametrize("max_balloons, uid, name, shares", [(1, "a", "side", 1024), (2, "b", "app", 3 * 1024)])
async def test_a_container_its_type_cannot_take_within_max_cpus_goes_to_the_default_balloon(
    tmp_path, max_balloons: int, uid: str, name: str, shares: int
) -> None:
    """a's side container does not fit in a's balloon (maxCPUs 2) and work
    has no room for another balloon; b's 3 CPUs fit in no balloon of work:
    the default balloon takes them, not a balloon of work beyond maxCPUs."""
    work = {"name": "work", "namespaces": ["*"], "maxBalloons": max_balloons, "maxCPUs": 2}
    hook, _, _ = await hook_on_sysfs(tmp_path, {**ONE, "onExhausted": "Ignore", "balloonTypes": [work]})
    await hook.pre_create_container(request("a", "app", shares=2 * 1024, cid="c-a"))
    await hook.pre_create_container(request(uid, name, shares=shares, cid="c-x"))
    assert [(name, ids) for name, _, ids in balloons(hook)] == [("reserved[0]", []), ("work[0]", ["c-a"]), ("default[0]", ["c-x"])]


@pytest.mark.parametrize("uid, name, shares", [("a", "side", 1024), ("b", "app", 3 * 1024)])
def test_a_container_placed_beyond_its_types_max_cpus_stays_where_it_is_at_a_restart_and_a_reload(
    uid: str, name: str, shares: int
) -> None:
    """a's side container took a balloon of its own (a's, at maxCPUs 2, had
    no room); b's 3 CPUs took the default balloon. Restored, side joined a's
    balloon beyond maxCPUs and b took a new balloon of work: both moved."""
    work = {"name": "work", "namespaces": ["*"], "maxCPUs": 2}
    config = parse_config({**ONE, "onExhausted": "Ignore", "balloonTypes": [work]})
    topology = Topology.synthetic(1, 2, 4, 1)
    state = Assignments(config, topology)
    pod = lambda uid, name: PodContext("apps", f"pod-{uid}", name)  # noqa: E731
    for key, milli in ((("a", "app"), 2000), ((uid, name), milli_from_shares(shares))):
        state.place(Member(key, "apps", f"pod-{key[0]}", milli, f"c-{key[0]}-{key[1]}"), pod(*key))
        state.given(key, state.target(key))
    planned = {b.name: (format_cpuset(b.cpus), sorted(b.members)) for b in state.pool.balloons}
    restart = restoring.rebuild(config, topology, found(state))
    for again in (restart, restoring.replan(state, config, topology)):
        assert {b.name: (format_cpuset(b.cpus), sorted(b.members)) for b in again.pool.balloons} == planned
        assert again.moves() == []


def test_with_no_cpu_free_a_container_its_type_cannot_take_goes_to_the_default_balloons_cpus() -> None:
    """Under Ignore, b (work) finds no CPU free: a's balloon fills node 1 and
    d's default one 1-3. It took a new balloon of work, with no CPU (the
    reserved one, beside kube-system's), each such pod another balloon
    against maxBalloons; at a restart or reload, where it ran on the default
    balloon's CPUs, it now stays."""
    config = parse_config({**ONE, "onExhausted": "Ignore",
                           "balloonTypes": [{"name": "work", "namespaces": ["apps"], "preferNewBalloons": True}]})
    topology = Topology.synthetic(1, 2, 4, 1)
    state = Assignments(config, topology)
    for uid, ns, milli in (("d", "other", 3000), ("a", "apps", 4000), ("b", "apps", 2000)):
        state.place(Member((uid, "c"), ns, f"pod-{uid}", milli, f"c-{uid}"), PodContext(ns, f"pod-{uid}", "c"))
        state.given((uid, "c"), state.target((uid, "c")))
    layout = {b.name: (format_cpuset(b.cpus), sorted(k[0] for k in b.members)) for b in state.pool.balloons}
    assert layout == {"reserved[0]": ("0", []), "default[0]": ("1-3", ["b", "d"]), "work[0]": ("4-7", ["a"])}
    restart = restoring.rebuild(config, topology, found(state))
    for again in (restart, restoring.replan(state, config, topology)):
        assert {b.name: (format_cpuset(b.cpus), sorted(k[0] for k in b.members)) for b in again.pool.balloons} == layout
        assert again.moves() == []


# -- requests lowered, CPUs freed


async def test_a_container_in_a_short_balloon_lowers_its_request(tmp_path) -> None:
    """a's balloon holds 7 of the 9 CPUs a's containers request. The side
    container's lower request was refused (its balloon could not reach the
    lower target either) and the old one kept; now it is taken, and a
    request below what the balloon holds shrinks it."""
    hook, runtime, _ = await hook_on_sysfs(tmp_path, ONE)
    await hook.pre_create_container(request("a", "app", shares=6 * 1024))
    await hook.pre_start_container(request("a", "app", cid="c-a"))
    runtime.live = [
        FoundContainer("c-a", ("a", "app"), PodContext("apps", "pod-a", "app"), "a", frozenset(range(1, 7)), "0-1", 6 * 1024),
        FoundContainer("c-s", ("a", "side"), PodContext("apps", "pod-a", "side"), "a", frozenset(range(1, 8)), "0-1", 3 * 1024),
    ]
    await hook.reconcile()
    assert balloons(hook)[1:] == [("work[0]", "1-7", ["c-a", "c-s"])]
    answer = await hook.pre_update_container_resources(request("a", "side", shares=2 * 1024, cid="c-s"))
    assert answer.container_resources.cpuset_cpus == "1-7"
    assert hook.status()["balloons"][1]["requested_milli_cpus"] == 8000
    answer = await hook.pre_update_container_resources(request("a", "app", shares=4 * 1024, cid="c-a"))
    assert len(parse_cpuset(answer.container_resources.cpuset_cpus)) == 6


def test_a_new_attempt_that_needs_fewer_cpus_leaves_the_rest_to_a_short_balloon() -> None:
    """a's app (3 CPUs) is created again, its stop unseen, asking for 1: the
    2 CPUs its previous attempt held go to b's balloon, short of one."""
    config = parse_config({**ONE, "onExhausted": "Ignore", "balloonTypes": [WORK["balloonTypes"][0]]})
    state = Assignments(config, Topology.synthetic(1, 2, 4, 1))
    pod = lambda uid, name: PodContext("apps", f"pod-{uid}", name)  # noqa: E731
    for uid, name, milli in (("a", "app", 3000), ("b", "app", 4000), ("b", "side", 1000)):
        state.place(Member((uid, name), "apps", f"pod-{uid}", milli), pod(uid, name))
    assert [len(b.cpus) for b in state.pool.balloons] == [1, 3, 4]
    state.place(Member(("a", "app"), "apps", "pod-a", 1000), pod("a", "app"))
    assert {b.name: (len(b.cpus), b.target_size()) for b in state.pool.balloons} == {
        "reserved[0]": (1, 0), "work[0]": (1, 1), "work[1]": (5, 5)
    }


def test_cpus_freed_go_first_to_short_balloons_without_any() -> None:
    """Their containers run on the reserved CPUs; a balloon short of as many
    but with CPUs of its own waits."""
    pool = Pool(parse_config(ONE | {"balloonTypes": [{"name": "work", "namespaces": ["*"]}]}), Topology.synthetic(1, 2, 4, 1))
    work = pool.types["work"]
    some, none, full = (pool._new_balloon(work, size) for size in (1, 0, 5))
    for balloon, milli in ((some, 3000), (none, 2000), (full, 5000)):
        balloon.members[("x", balloon.name)] = Member(("x", balloon.name), "apps", "pod-x", milli)
    assert len(pool.free) == 1
    assert pool.grow_short() == [none]
    assert (len(some.cpus), len(none.cpus)) == (1, 1)


def test_a_min_balloons_balloon_made_without_cpus_at_a_restart_grows_when_cpus_are_freed(caplog) -> None:
    """At the restart a's containers run on every CPU but the reserved one:
    batch's minBalloons balloon is made with none. When a's side container
    goes, the CPUs it frees bring batch[0] to its minCPUs (it grew only
    with members)."""
    config = parse_config({**ONE, "balloonTypes": [
        {"name": "batch", "namespaces": ["batch"], "minBalloons": 1, "minCPUs": 2},
        {"name": "work", "namespaces": ["apps"]},
    ]})
    topology = Topology.synthetic(1, 2, 4, 1)
    found = [
        Restored(Member(("a", name), "apps", "pod-a", milli, f"c-{name}"), PodContext("apps", "pod-a", name),
                 frozenset(range(1, 8)), "0-1")
        for name, milli in (("app", 4000), ("side", 3000))
    ]
    state = restoring.rebuild(config, topology, found)
    assert {b.name: len(b.cpus) for b in state.pool.balloons} == {"reserved[0]": 1, "work[0]": 7, "batch[0]": 0}
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        state.release(("a", "side"))
    assert {b.name: len(b.cpus) for b in state.pool.balloons} == {"reserved[0]": 1, "work[0]": 4, "batch[0]": 2}
    assert "batch[0]" in caplog.text and "grows from the CPUs free now to 2 of the 2 CPUs of its minCPUs" in caplog.text


def test_cpus_freed_go_to_balloons_short_for_their_containers_before_empty_ones_below_min_cpus() -> None:
    pool = Pool(parse_config(ONE | {"balloonTypes": [{"name": "work", "namespaces": ["*"], "minCPUs": 2}]}),
                Topology.synthetic(1, 2, 4, 1))
    work = pool.types["work"]
    empty, some, full = (pool._new_balloon(work, size) for size in (0, 1, 5))
    for balloon, milli in ((some, 3000), (full, 5000)):
        balloon.members[("x", balloon.name)] = Member(("x", balloon.name), "apps", "pod-x", milli)
    assert len(pool.free) == 1
    assert pool.grow_short() == [some] and not empty.cpus
    pool.release(("x", full.name))
    assert pool.grow_short() == [some, empty]
    assert (len(some.cpus), len(empty.cpus)) == (3, 2)


def test_under_pin_cpu_false_a_reload_keeps_a_container_its_type_could_not_take_in_the_default_balloon() -> None:
    """As with pinCPU: true, a (work, 3 CPUs: work[0], its only balloon, is
    b's) stays in the default balloon at a reload while its type has no room
    for it. It was placed anew (its balloon's type not its own) after the
    default balloon shrank without it, which then grew elsewhere: a and d moved."""
    config = parse_config({**ONE, "onExhausted": "Ignore", "pinCPU": False,
                           "balloonTypes": [{"name": "work", "namespaces": ["apps"], "maxBalloons": 1, "maxCPUs": 3}]})
    topology = Topology.synthetic(1, 2, 4, 1)
    state = Assignments(config, topology)
    for uid, ns, milli in (("d", "other", 1000), ("b", "apps", 2000), ("a", "apps", 3000)):
        state.place(Member((uid, "c"), ns, f"pod-{uid}", milli, f"c-{uid}"), PodContext(ns, f"pod-{uid}", "c"))
    for uid in "dba":
        state.given((uid, "c"), state.target((uid, "c")))
    layout = {b.name: (format_cpuset(b.cpus), sorted(k[0] for k in b.members)) for b in state.pool.balloons}
    assert layout == {"reserved[0]": ("0", []), "default[0]": ("1,4-6", ["a", "d"]), "work[0]": ("2-3", ["b"])}
    again = restoring.replan(state, config, topology)
    assert {b.name: (format_cpuset(b.cpus), sorted(k[0] for k in b.members)) for b in again.pool.balloons} == layout
    assert again.moves() == []
    # b gone, its type has room: a stays at a reload of the same config, as
    # placement leaves it, and moves into a balloon of its own type at a
    # reload of a changed one.
    state.release(("b", "c"))
    same = restoring.replan(state, config, topology)
    assert {b.name: sorted(k[0] for k in b.members) for b in same.pool.balloons} == {
        "reserved[0]": [], "default[0]": ["a", "d"]
    }
    changed = parse_config({**ONE, "onExhausted": "Ignore", "pinCPU": False, "balloonTypes": [
        {"name": "work", "namespaces": ["apps"], "maxBalloons": 1, "maxCPUs": 3}, {"name": "batch", "namespaces": ["batch"]}]})
    again = restoring.replan(state, changed, topology)
    assert {b.name: sorted(k[0] for k in b.members) for b in again.pool.balloons} == {
        "reserved[0]": [], "default[0]": ["d"], "work[0]": ["a"]
    }
