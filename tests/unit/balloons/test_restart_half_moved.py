"""A restart finding a move left half done on the reserved CPUs (given as a
quantity) with the balloons saved in stateDir (docs/hook-balloons.md,
Restarts; savedstart.py): the saved balloons are consulted before the saved
reserved set is given up for what runs. They name that set and put the
container found off it back in its balloon, moved, rather than the restart
deducing other reserved CPUs and rebuilding every balloon from the cpusets.
Machine as in test_hotplug: CPUs 0-3 on NUMA node 0, 4-7 on node 1.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from hooks.balloons.config import parse_config
from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import format_cpuset

from .test_hotplug import balloons
from .test_replan import running
from .test_restart_reserved import cpu_0_offline_and_back
from .test_saved_reserved import WORK, written
from .test_server import FakeRuntime

TWO_RESERVED = {"reservedResources": {"cpu": "2"}, "balloonTypes": [WORK]}


async def _restart_with_dns_half_moved(
        tmp_path: Path, config: dict, caplog) -> tuple[BalloonsHook, BalloonsHook, FakeRuntime, str]:
    """dns (kube-system: the reserved type) and a (apps) placed, CPU 0
    offline and back (the reserved CPUs 1,3 since, not the first start's
    pick), saved; a restarted hook finds dns on one of the two reserved CPUs
    only (its move there not done when the hook stopped). The first hook,
    the second, its runtime, the reserved CPUs."""
    hook, root = await cpu_0_offline_and_back(tmp_path, config, [("dns", "kube-system"), ("a", "apps")])
    await written(hook)
    reserved = hook.state.pool.reserved
    assert len(reserved) == 2
    runtime = FakeRuntime()
    runtime.live = [dataclasses.replace(f, cpus=frozenset({min(reserved)})) if f.container_id == "c-dns" else f
                    for f in running(hook)]
    again = BalloonsHook(str(tmp_path / "restarted.sock"), parse_config(config), sysfs_root=root, runtime=runtime)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await again.rebuild()
    assert await again.apply_moves()
    return hook, again, runtime, format_cpuset(reserved)


async def test_a_move_half_done_on_the_reserved_cpus_is_put_back_by_the_saved_balloons(tmp_path: Path, caplog) -> None:
    """The reserved CPUs and every balloon as saved, dns alone moved back
    onto both reserved CPUs (before: the saved set refused, "some of them
    only", the reserved CPUs deduced, 0-1, and the balloons rebuilt from the
    cpusets: CPU 3 no longer reserved, dns moved to 0-1)."""
    state = tmp_path / "state"
    hook, again, runtime, reserved = await _restart_with_dns_half_moved(tmp_path, {**TWO_RESERVED, "stateDir": str(state)}, caplog)
    assert again.status()["reserved_cpus"] == reserved
    assert balloons(again) == balloons(hook)
    assert [(cid, cpus) for cid, cpus, _ in runtime.updates] == [("c-dns", reserved)]
    [line] = [r for r in caplog.records if r.getMessage().startswith(f"reserved CPUs {reserved} at start")]
    assert line.levelno == logging.INFO and line.saved
    assert line.getMessage().startswith(
        f"reserved CPUs {reserved} at start: the saved set in {state / 'reserved.json'}, as the saved balloons "
        "written with it name it, which put back the containers found off them (what runs alone: deduced from the "
        "CPUs the containers run on: ")
    assert "some of them only" in line.getMessage()
    [start] = [r for r in caplog.records if r.getMessage().startswith("balloons at start")]
    assert start.saved and start.put_back == [f"kube-system/pod-dns/app in {again.state.pool.balloon_of(('dns', 'app')).name}"]


async def test_without_saved_balloons_such_a_restart_still_deduces(tmp_path: Path, caplog) -> None:
    """Guards existing behaviour: the balloons' file gone (an older hook's
    stateDir), the saved set alone is refused as before, with the warning."""
    state = tmp_path / "state"
    config = {**TWO_RESERVED, "stateDir": str(state)}
    hook, root = await cpu_0_offline_and_back(tmp_path, config, [("dns", "kube-system")])
    await written(hook)
    (state / "balloons.json").unlink()
    reserved = hook.state.pool.reserved
    runtime = FakeRuntime()
    runtime.live = [dataclasses.replace(f, cpus=frozenset({min(reserved)})) for f in running(hook)]
    again = BalloonsHook(str(tmp_path / "restarted.sock"), parse_config(config), sysfs_root=root, runtime=runtime)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await again.rebuild()
    [line] = [r for r in caplog.records if r.getMessage().startswith("reserved CPUs")]
    assert line.levelno == logging.WARNING and "some of them only" in line.getMessage() and not line.saved
    assert again.status()["reserved_cpus"] == "0-1"  # deduced: not the saved 1,3
