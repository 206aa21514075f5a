"""What NRI allows a hook: time (the runtime's request timeout) and which
answers it can apply at each event.

Both wrap the proxy's own hook path rather than change it: the registry seen
through :class:`ClampedRegistry` hands the dispatcher servers whose timeout
fits the runtime's, and :class:`ObservingDispatcher` is the proxy's
dispatcher that also reports answers NRI cannot apply.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

from google.protobuf.message import Message

from ..hookpath.chaincpuset import ChainCpusets
from ..hookpath.dispatch import Dispatcher
from ..hookpath.hookfile import HookServerConfig
from ..hookpath.nodefacts import NodeFactsSource
from ..hookpath.points import HOOK_POINTS, HookType, Phase
from ..hookpath.registry import ChangeCallback, HookRegistry, HookSnapshot
from ..metrics import Metrics

log = logging.getLogger(__name__)

# Answer fields NRI applies, per pre hook point; everything else a hook
# changes there is dropped (and logged once per server and field).
APPLIED: dict[HookType, frozenset[str]] = {
    HookType.PRE_CREATE_CONTAINER: frozenset(
        {"container_annotations", "container_envs", "container_resources", "pod_cgroup_parent"}
    ),
    HookType.PRE_UPDATE_CONTAINER_RESOURCES: frozenset({"container_resources"}),
    HookType.PRE_RUN_POD_SANDBOX: frozenset(),  # NRI reports the pod once it runs
    HookType.PRE_START_CONTAINER: frozenset(),  # the container is created: nothing left to adjust
}
# The line the plugin logs such a field with (hooks.answercheck tells a hook's author so too).
NRI_DROPPED = "NRI cannot apply this hook answer at this event; dropped"
# Never applicable: an NRI adjustment or update has no OOM score; and NRI's
# AdjustResources sets the swap limit to the memory limit, whatever the
# adjustment's swap says (an update's swap is applied).
NEVER_APPLIED_RESOURCES: dict[HookType, frozenset[str]] = {
    HookType.PRE_CREATE_CONTAINER: frozenset({"oom_score_adj", "memory_swap_limit_in_bytes"}),
    HookType.PRE_UPDATE_CONTAINER_RESOURCES: frozenset({"oom_score_adj"}),
}


# When the hooks of the event under way must have answered (loop time). Set
# for the hook stage's task of one event; post hooks, started from it, read
# no deadline (they run after the answer, as in the proxy).
HOOK_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("nri_hook_deadline", default=None)
MIN_CALL = 0.01  # a server with no time left still fails by its own timeout, with its own policy


class _Chain(tuple[HookServerConfig, ...]):
    """A pre hook's servers; each, when its turn comes, gets at most the time
    left before the event's deadline (so a chain fits the runtime's timeout,
    and a Fail server that gets no time refuses the call by its policy)."""

    def __iter__(self) -> Iterator[HookServerConfig]:
        for server in tuple.__iter__(self):
            deadline = HOOK_DEADLINE.get()
            if deadline is not None:
                left = max(deadline - asyncio.get_running_loop().time(), MIN_CALL)
                if server.timeout > left:
                    server = dataclasses.replace(server, timeout=left)
            yield server


def order_wait(registry: ClampedRegistry) -> Callable[[HookType], float | None]:
    """How long a pre hook may wait for the post hooks of its object still
    running (``HookStage``): what the event's time leaves once its servers
    have theirs. Without a deadline (a post hook's own task): until they end."""

    def limit(hook: HookType) -> float | None:
        deadline = HOOK_DEADLINE.get()
        if deadline is None:
            return None
        servers = sum(server.timeout for server in tuple.__iter__(registry.servers_for(hook)))
        return max(0.0, deadline - asyncio.get_running_loop().time() - servers)

    return limit


class ClampedRegistry:
    """The hook registry as the dispatcher sees it under NRI (a
    ``HookSource``): no server's timeout is longer than ``limit`` (logged
    once per server), in its snapshot, the one its change callbacks get and
    the servers it hands out. What the dispatcher keeps by config (answers
    noted as unapplied) it keys by this snapshot's: a pre hook's chain
    (``_Chain``) hands out a copy with the time left for a timeout, a new
    one at each call, equal to no config of the snapshot."""

    def __init__(self, registry: HookRegistry, limit: float) -> None:
        self._registry = registry
        self.limit = limit
        self._clamped: dict[HookServerConfig, HookServerConfig] = {}
        self._snapshot = HookSnapshot()
        registry.on_change(self._note)  # first: a callback given to on_change below reads its snapshot
        self._note(registry.snapshot)

    def _note(self, snapshot: HookSnapshot) -> None:
        known = {server: self._clamped.get(server) or self._clamp(server) for server in snapshot.servers.values()}
        self._clamped = known
        self._snapshot = HookSnapshot({name: known[server] for name, server in snapshot.servers.items()},
                                      snapshot.generation)

    @property
    def snapshot(self) -> HookSnapshot:
        return self._snapshot

    def _clamp(self, server: HookServerConfig) -> HookServerConfig:
        if server.timeout <= self.limit:
            return server
        log.warning(
            "hook timeout longer than NRI allows, clamped",
            extra={**server.log_fields(), "clamped_timeout": self.limit},
        )
        return dataclasses.replace(server, timeout=self.limit)

    def servers_for(self, hook: HookType) -> tuple[HookServerConfig, ...]:
        servers = self._snapshot.servers_for(hook)
        return _Chain(servers) if HOOK_POINTS[hook].phase is Phase.PRE else servers

    def on_change(self, callback: ChangeCallback) -> Callable[[], None]:
        """``callback`` gets the clamped snapshot after each change; returns
        the function that unsubscribes it (the registry's)."""
        return self._registry.on_change(lambda _: callback(self._snapshot))


def _plain(value: Any) -> Any:
    """Protobuf containers as plain values, so that they compare by content."""
    if hasattr(value, "items"):
        return dict(value.items())
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return value
    try:
        return list(value)
    except TypeError:
        return value


def unapplied(hook: HookType, request: Message, answer: Message) -> list[str]:
    """The answer's changes that NRI cannot apply at this hook point (fields
    the answer sets to other values than the request had)."""
    applied = APPLIED.get(hook)
    if applied is None:
        return []  # a post hook: its answer is ignored anyway, as in the proxy
    out: list[str] = []
    for field, value in answer.ListFields():
        name = field.name
        mine = getattr(request, name, None)
        if isinstance(value, Message):
            for sub, sub_value in value.ListFields():
                differs = mine is None or _plain(getattr(mine, sub.name)) != _plain(sub_value)
                if differs and (name not in applied or sub.name in NEVER_APPLIED_RESOURCES.get(hook, ())):
                    out.append(f"{name}.{sub.name}")
        elif name not in applied and (
            hasattr(value, "items") and any(_plain(mine).get(k) != v for k, v in value.items())
            or not hasattr(value, "items") and _plain(value) != _plain(mine)
        ):
            out.append(name)
    return out


class ObservingDispatcher(Dispatcher):
    """The proxy's dispatcher; it also logs, once per server, hook point and
    field, the answers NRI cannot apply."""

    def __init__(self, registry: Any, metrics: Metrics | None = None, node: NodeFactsSource | None = None) -> None:
        super().__init__(registry, metrics, node=node, clears_cpusets=False)  # containerd ignores an empty cpuset
        self._logged: set[tuple[str, HookType, str]] = set()

    async def call(self, server: HookServerConfig, hook: HookType, request: Any, chain: ChainCpusets | None = None) -> Any:
        answer = await super().call(server, hook, request, chain)
        for name in unapplied(hook, request, answer):
            if (server.name, hook, name) not in self._logged:
                self._logged.add((server.name, hook, name))
                log.warning(
                    f"{NRI_DROPPED} (logged once per server)",
                    extra={**server.log_fields(), "hook": hook.value, "dropped": name},
                )
        return answer
