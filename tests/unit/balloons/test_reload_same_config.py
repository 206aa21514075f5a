"""A reload of the same config moves no pinned container: an operator who
touches the config file must not see workloads migrate between CPUs, nor
the runtime be asked to give a container the cpuset it has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hooks.balloons.server import BalloonsHook

from .test_hotplug import hook_on_sysfs
from .test_server import request


async def reloaded(hook: BalloonsHook, tmp_path: Path, config: dict[str, Any]) -> None:
    """``hook`` reloads ``config`` from its file, its moves done."""
    path = tmp_path / "balloons.yaml"
    path.write_text(yaml.safe_dump(config))
    assert await hook.reload(path)
    assert await hook.apply_moves()


async def test_a_container_given_every_cpu_is_not_moved_by_a_reload(tmp_path) -> None:
    """kube-system's k runs on the reserved CPU and every idle one, 0-7: taken
    for not pinned at the reload, it was given 0-7 again."""
    config = {"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "reserved", "shareIdleCPUsInSame": "system"}]}
    hook, runtime, _ = await hook_on_sysfs(tmp_path, config)
    answer = await hook.pre_create_container(request("k", "dns", ns="kube-system"))
    assert answer.container_resources.cpuset_cpus == "0-7"
    await hook.pre_start_container(request("k", "dns", ns="kube-system", cid="c-k"))
    assert await hook.apply_moves()
    await reloaded(hook, tmp_path, config)
    assert runtime.updates == []
