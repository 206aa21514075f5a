"""A balloon left with fewer CPUs than its containers request (none was free
for it) grows as soon as CPUs are free again: not only when its members
change. Machines as in test_hotplug: CPUs 0-3 on NUMA node 0, 4-7 on node 1.
"""

from __future__ import annotations

import logging

from cri_api.hookapi import api_pb2
from hooks.balloons.server import BalloonsHook

from .test_hotplug import hook_on_sysfs, set_online
from .test_server import FakeRuntime, request


def balloons(hook: BalloonsHook) -> list[tuple[str, str, list[str]]]:
    return [(b["name"], b["cpus"], [c["id"] for c in b["containers"]]) for b in hook.status()["balloons"]]


async def b_left_without_cpus(hook: BalloonsHook, runtime: FakeRuntime, root) -> None:
    """Pod a on 1-3, pod b on 4-7; 4-7 go offline: b, placed anew, finds no
    CPU free and lands in the default balloon, which gets none (b runs on
    the reserved CPU 0)."""
    for uid, shares in (("a", 3 * 1024), ("b", 4 * 1024)):
        await hook.pre_create_container(request(uid, "app", shares=shares))
        await hook.pre_start_container(request(uid, "app", cid=f"c-{uid}"))
    assert await hook.apply_moves()
    assert balloons(hook)[1:] == [("work[0]", "1-3", ["c-a"]), ("work[1]", "4-7", ["c-b"])]
    set_online(root, "0-3")
    await hook.reconcile()
    assert await hook.apply_moves()
    assert balloons(hook)[1:] == [("work[0]", "1-3", ["c-a"]), ("default[0]", "", ["c-b"])]
    assert runtime.updates[-1] == ("c-b", "0", "0")


async def test_a_balloon_left_without_cpus_grows_when_another_balloon_goes(tmp_path, caplog) -> None:
    hook, runtime, root = await hook_on_sysfs(tmp_path)
    await b_left_without_cpus(hook, runtime, root)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await hook.post_stop_pod_sandbox(api_pb2.PodSandboxHookRequest(pod_meta=api_pb2.PodSandboxMetadata(uid="a")))
        assert await hook.apply_moves()
    # As far as CPUs are free: 3 of the 4 b requests.
    assert balloons(hook)[1:] == [("default[0]", "1-3", ["c-b"])]
    assert runtime.updates[-1] == ("c-b", "1-3", "0")
    assert "balloon default[0]" in caplog.text and "grows from the CPUs free now to 3 of the 4 CPUs" in caplog.text


async def test_a_balloon_left_without_cpus_grows_when_another_one_shrinks(tmp_path) -> None:
    """a's request drops from 3 CPUs to 1 (an in-place resize): 2 CPUs go to b."""
    hook, runtime, root = await hook_on_sysfs(tmp_path)
    await b_left_without_cpus(hook, runtime, root)
    await hook.pre_update_container_resources(request("a", "app", shares=1024, cid="c-a"))
    assert await hook.apply_moves()
    assert balloons(hook)[1:] == [("work[0]", "1", ["c-a"]), ("default[0]", "2-3", ["c-b"])]
    assert runtime.updates[-1] == ("c-b", "2-3", "0")
