"""An in-place resize raising a container's request in a balloon that
cannot grow to it: refused under onExhausted: Fail, unless the balloon needs
no more CPUs for it; under Ignore taken, the balloon growing as CPUs are
free. Machines as in test_hotplug: CPUs 0-3 on NUMA node 0, 4-7 on node 1.
"""

from __future__ import annotations

import logging

import pytest

from cri_api.hookapi import api_pb2
from hooks.balloons import restoring
from hooks.balloons.balloon import Member
from hooks.balloons.config import PodContext, parse_config
from hooks.balloons.state import Assignments
from hooks.balloons.topology import Topology

from .test_hotplug import WORK, hook_on_sysfs
from .test_server import request


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_a_raise_that_needs_no_more_cpus_than_a_short_balloons_target_is_taken(policy: str) -> None:
    """a's balloon holds 7 of the 9 CPUs a's containers request; side's
    2500m -> 2900m leaves that at 9. It was refused (the balloon could not
    reach 9), and under Ignore the stale request kept."""
    config = parse_config({**WORK, "onExhausted": policy})
    state = Assignments(config, Topology.synthetic(1, 2, 4, 1))
    state.place(Member(("a", "app"), "apps", "pod-a", 6000, "c-a"), PodContext("apps", "pod-a", "app"))
    state.place(Member(("a", "side"), "apps", "pod-a", 2500, "c-s"), PodContext("apps", "pod-a", "side"), running=True)
    balloon = state.pool.balloon_of(("a", "side"))
    assert (len(balloon.cpus), balloon.target_size()) == (7, 9)
    assert state.resize(("a", "side"), 2900)
    assert balloon.members[("a", "side")].milli == 2900


def test_a_raise_too_few_cpus_are_free_for_under_ignore_takes_those_free() -> None:
    """a asks 6 CPUs rather than 1 while b's 4 leave 2 free: not met, but
    taken, a's balloon growing by the 2 free at once (not only when more are
    freed)."""
    config = parse_config({**WORK, "onExhausted": "Ignore"})
    state = Assignments(config, Topology.synthetic(1, 2, 4, 1))
    state.place(Member(("a", "app"), "apps", "pod-a", 1000, "c-a"), PodContext("apps", "pod-a", "app"))
    state.place(Member(("b", "app"), "apps", "pod-b", 4000, "c-b"), PodContext("apps", "pod-b", "app"))
    balloon = state.pool.balloon_of(("a", "app"))
    assert (len(balloon.cpus), len(state.pool.free)) == (1, 2)
    assert not state.resize(("a", "app"), 6000)
    assert (balloon.members[("a", "app")].milli, len(balloon.cpus), state.pool.free) == (6000, 3, frozenset())


async def test_a_raise_no_cpu_is_free_for_is_taken_under_ignore_and_met_when_cpus_are_freed(tmp_path, caplog) -> None:
    """a asks 3 CPUs rather than 1 while b's 6 leave none free: its request
    was dropped (a's balloon stayed at 1 CPU when b's went)."""
    hook, _, _ = await hook_on_sysfs(tmp_path, {**WORK, "onExhausted": "Ignore"})
    await hook.pre_create_container(request("a", "app", shares=1024, cid="c-a"))
    await hook.pre_create_container(request("b", "app", shares=6 * 1024, cid="c-b"))
    with caplog.at_level(logging.WARNING, logger="hooks.balloons"):
        answer = await hook.pre_update_container_resources(request("a", "app", shares=3 * 1024, cid="c-a"))
    assert answer.container_resources.cpuset_cpus == "1"
    assert "its balloon takes the CPUs free, and more as they are freed" in caplog.text
    await hook.post_stop_pod_sandbox(api_pb2.PodSandboxHookRequest(pod_meta=api_pb2.PodSandboxMetadata(uid="b")))
    [_, a] = hook.status()["balloons"]
    assert (a["name"], a["cpus"], a["requested_milli_cpus"]) == ("work[0]", "1-3", 3000)


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_a_raise_beyond_max_cpus_of_a_balloon_at_max_cpus_is_refused_and_the_old_request_stands(policy: str) -> None:
    """a's balloon is at maxCPUs 2; 2000m -> 4000m was taken (its target,
    capped at maxCPUs, did not grow), and the next reload moved a to the
    default balloon (its requests no longer fit its type)."""
    config = parse_config({"reservedResources": {"cpu": "cpuset:0"}, "onExhausted": policy,
                           "balloonTypes": [{"name": "work", "namespaces": ["*"], "maxCPUs": 2}]})
    topology = Topology.synthetic(1, 1, 8, 1)
    state = Assignments(config, topology)
    key = ("a", "c")
    state.place(Member(key, "apps", "a", 2000, "id-a"), PodContext("apps", "a", "c"))
    state.given(key, state.target(key))
    assert not state.resize(key, 4000)
    balloon = state.pool.balloon_of(key)
    assert (balloon.name, balloon.members[key].milli, len(balloon.cpus)) == ("work[0]", 2000, 2)
    assert restoring.replan(state, config, topology).pool.balloon_of(key).name == "work[0]"
