"""The one table: which CRI call triggers which hook point.

| CRI call                 | before the backend call     | after a successful call |
|--------------------------|-----------------------------|-------------------------|
| RunPodSandbox            | PreRunPodSandbox            |                         |
| StopPodSandbox           |                             | PostStopPodSandbox      |
| CreateContainer          | PreCreateContainer          |                         |
| StartContainer           | PreStartContainer           | PostStartContainer      |
| StopContainer            |                             | PostStopContainer       |
| UpdateContainerResources | PreUpdateContainerResources |                         |
| RemoveContainer, RemovePodSandbox: no hook; they drop stored state.  |

Every other CRI method is relayed as bytes and never decoded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from . import executor as ex
from .hookfile import HookType


@dataclass(frozen=True)
class HookPoint:
    method: str
    executor: ex.Executor
    pre: HookType | None = None
    post: HookType | None = None


HOOK_POINTS: Mapping[str, HookPoint] = MappingProxyType(
    {
        p.method: p
        for p in (
            HookPoint("RunPodSandbox", ex.RunPodSandbox(), pre=HookType.PRE_RUN_POD_SANDBOX),
            HookPoint("StopPodSandbox", ex.StopPodSandbox(), post=HookType.POST_STOP_POD_SANDBOX),
            HookPoint("RemovePodSandbox", ex.RemovePodSandbox()),
            HookPoint("CreateContainer", ex.CreateContainer(), pre=HookType.PRE_CREATE_CONTAINER),
            HookPoint(
                "StartContainer",
                ex.StartContainer(),
                pre=HookType.PRE_START_CONTAINER,
                post=HookType.POST_START_CONTAINER,
            ),
            HookPoint("StopContainer", ex.StopContainer(), post=HookType.POST_STOP_CONTAINER),
            HookPoint("RemoveContainer", ex.RemoveContainer()),
            HookPoint(
                "UpdateContainerResources",
                ex.UpdateContainerResources(),
                pre=HookType.PRE_UPDATE_CONTAINER_RESOURCES,
            ),
        )
    }
)
