"""The hooked CRI methods: each one's executor and hook points.

Which hook points each method triggers is declared once, in :mod:`.points`;
how each method reads and writes hooks in its executor (executorbase.py,
podexecutors.py, containerexecutors.py). The table :data:`HOOKED_METHODS`
joins the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .containerexecutors import (
    CreateContainer,
    RemoveContainer,
    StartContainer,
    StopContainer,
    UpdateContainerResources,
)
from .executorbase import Executor
from .podexecutors import RemovePodSandbox, RunPodSandbox, StopPodSandbox
from .points import HookType, Phase, hook_for

__all__ = ["HOOKED_METHODS", "HookedMethod"]


@dataclass(frozen=True)
class HookedMethod:
    """A CRI method the hook stage decodes: its executor and its hook points."""

    method: str
    executor: Executor
    pre: HookType | None
    post: HookType | None
    keeps_state: bool  # its executor records calls (or re-checks them)


def _hooked(*executors: Executor) -> Mapping[str, HookedMethod]:
    table = {}
    for executor in executors:
        method = type(executor).__name__
        kind = type(executor)
        keeps_state = kind.record is not Executor.record or kind.unsure is not Executor.unsure
        table[method] = HookedMethod(
            method, executor, hook_for(method, Phase.PRE), hook_for(method, Phase.POST), keeps_state
        )
    return MappingProxyType(table)


# The CRI methods that go through the hook stage: those that trigger a hook
# point, and the removals that drop stored state.
HOOKED_METHODS: Mapping[str, HookedMethod] = _hooked(
    RunPodSandbox(),
    StopPodSandbox(),
    RemovePodSandbox(),
    CreateContainer(),
    StartContainer(),
    StopContainer(),
    RemoveContainer(),
    UpdateContainerResources(),
)
