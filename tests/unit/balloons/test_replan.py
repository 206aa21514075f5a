"""A re-plan (hotplug, a reload) and a restart rebuild the balloons from what
the containers run on: none whose balloon stays as it was may move. Machines
as in test_hotplug: CPUs 0-3 on NUMA node 0, 4-7 on node 1.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hooks.balloons.config import parse_config
from hooks.balloons.runtime import FoundContainer
from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import parse_cpuset

from .test_hotplug import WORK, hook_on_sysfs, set_online
from .test_server import FakeRuntime, request


def running(hook: BalloonsHook) -> list[FoundContainer]:
    """The hook's containers as the runtime lists them: on the cpusets it gave them."""
    state = hook.state
    return [
        FoundContainer(m.container_id, m.key, state.pods[m.key], m.pod_uid, parse_cpuset(state.applied[m.key][0]),
                       state.applied[m.key][1], math.ceil(m.milli * 1024 / 1000))
        for _, m in state.pool.members()
    ]


async def restarted(hook: BalloonsHook, tmp_path: Path, root: Path, config: dict[str, Any]) -> tuple[BalloonsHook, FakeRuntime]:
    """Another hook on the same machine, rebuilt from ``hook``'s containers, its moves done."""
    runtime = FakeRuntime()
    runtime.live = running(hook)
    again = BalloonsHook(str(tmp_path / "restarted.sock"), parse_config(config), sysfs_root=root, runtime=runtime)
    await again.rebuild()
    assert await again.apply_moves()
    return again, runtime


def balloons(hook: BalloonsHook) -> list[tuple[str, str, list[str]]]:
    return [(b["name"], b["cpus"], [c["id"] for c in b["containers"]]) for b in hook.status()["balloons"]]


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
