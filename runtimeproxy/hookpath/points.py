"""The hook points, declared once.

Every part that speaks the hook protocol reads this table: the proxy's hook
stage (which CRI call triggers which hook), the dispatcher (RPC name, request
and response classes), the SDK's servicer (handler names), the test hook
server and the bench. As in mitmproxy's ``hooks.py``, a hook point is a typed
declaration, not a string scattered through the code.

| CRI call                 | before the backend call     | after a successful call |
|--------------------------|-----------------------------|-------------------------|
| RunPodSandbox            | PreRunPodSandbox            |                         |
| StopPodSandbox           |                             | PostStopPodSandbox      |
| CreateContainer          | PreCreateContainer          |                         |
| StartContainer           | PreStartContainer           | PostStartContainer      |
| StopContainer            |                             | PostStopContainer       |
| UpdateContainerResources | PreUpdateContainerResources |                         |

RemoveContainer and RemovePodSandbox trigger no hook; they drop stored state.
Every other CRI method is relayed as bytes and never decoded.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from google.protobuf.message import Message

from cri_api.hookapi import api_pb2 as hookapi

SERVICE_NAME = "runtime.v1alpha1.RuntimeHookService"


class HookType(enum.Enum):
    """The seven hook points of ``RuntimeHookService``; the value is the name
    Koordinator's hook files use. Everything else about a hook point is in
    :data:`HOOK_POINTS`."""

    PRE_RUN_POD_SANDBOX = "PreRunPodSandbox"
    POST_STOP_POD_SANDBOX = "PostStopPodSandbox"
    PRE_CREATE_CONTAINER = "PreCreateContainer"
    PRE_START_CONTAINER = "PreStartContainer"
    POST_START_CONTAINER = "PostStartContainer"
    POST_STOP_CONTAINER = "PostStopContainer"
    PRE_UPDATE_CONTAINER_RESOURCES = "PreUpdateContainerResources"

    @property
    def point(self) -> HookPoint:
        return HOOK_POINTS[self]

    @property
    def rpc_name(self) -> str:
        """The RuntimeHookService method, e.g. ``PreCreateContainerHook``."""
        return HOOK_POINTS[self].rpc_name

    @property
    def is_pod_hook(self) -> bool:
        return HOOK_POINTS[self].kind is Kind.POD

    def __str__(self) -> str:
        return self.value

    # Members are singletons and compare by identity, so identity's hash (a C
    # slot) serves as well as Enum's own, a Python call made at every table
    # lookup of a hook point: several per hook call.
    __hash__ = object.__hash__


class Phase(enum.Enum):
    PRE = "pre"  # before the runtime call; its answer changes the request
    POST = "post"  # after a successful runtime call; its answer is ignored


class Kind(enum.Enum):
    POD = "pod"
    CONTAINER = "container"


@dataclass(frozen=True)
class HookPoint:
    hook: HookType
    cri_method: str  # the RuntimeService method that triggers it
    phase: Phase
    kind: Kind
    handler_name: str  # the SDK's HookServer method

    # Read on every hook call, so each is computed once (cached_property
    # writes the instance's __dict__, which a frozen dataclass allows).
    @functools.cached_property
    def rpc_name(self) -> str:
        return f"{self.hook.value}Hook"

    @functools.cached_property
    def full_method(self) -> str:
        return f"/{SERVICE_NAME}/{self.rpc_name}"

    @functools.cached_property
    def answer_applied(self) -> bool:
        """Whether its answer can change the call: a pre hook's, except
        PreStartContainer's (StartContainerRequest carries nothing to change)."""
        return self.phase is Phase.PRE and self.hook is not HookType.PRE_START_CONTAINER

    @functools.cached_property
    def request_type(self) -> type[Message]:
        return hookapi.PodSandboxHookRequest if self.kind is Kind.POD else hookapi.ContainerResourceHookRequest

    @functools.cached_property
    def response_type(self) -> type[Message]:
        return hookapi.PodSandboxHookResponse if self.kind is Kind.POD else hookapi.ContainerResourceHookResponse


def _declare(*points: HookPoint) -> Mapping[HookType, HookPoint]:
    table = {p.hook: p for p in points}
    assert set(table) == set(HookType), "every hook type is declared exactly once"
    return MappingProxyType(table)


HOOK_POINTS: Mapping[HookType, HookPoint] = _declare(
    HookPoint(HookType.PRE_RUN_POD_SANDBOX, "RunPodSandbox", Phase.PRE, Kind.POD, "pre_run_pod_sandbox"),
    HookPoint(HookType.POST_STOP_POD_SANDBOX, "StopPodSandbox", Phase.POST, Kind.POD, "post_stop_pod_sandbox"),
    HookPoint(HookType.PRE_CREATE_CONTAINER, "CreateContainer", Phase.PRE, Kind.CONTAINER, "pre_create_container"),
    HookPoint(HookType.PRE_START_CONTAINER, "StartContainer", Phase.PRE, Kind.CONTAINER, "pre_start_container"),
    HookPoint(HookType.POST_START_CONTAINER, "StartContainer", Phase.POST, Kind.CONTAINER, "post_start_container"),
    HookPoint(HookType.POST_STOP_CONTAINER, "StopContainer", Phase.POST, Kind.CONTAINER, "post_stop_container"),
    HookPoint(
        HookType.PRE_UPDATE_CONTAINER_RESOURCES,
        "UpdateContainerResources",
        Phase.PRE,
        Kind.CONTAINER,
        "pre_update_container_resources",
    ),
)


def hook_for(cri_method: str, phase: Phase) -> HookType | None:
    """The hook point a CRI method triggers in that phase, if any."""
    for point in HOOK_POINTS.values():
        if point.cri_method == cri_method and point.phase is phase:
            return point.hook
    return None
