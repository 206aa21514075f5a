"""Stand-ins for the dispatcher's registry and transport, for tests that need no hook-server process."""

from __future__ import annotations

from collections.abc import Callable

from runtimeproxy.hookpath.hookfile import HookServerConfig
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.registry import HookSnapshot


class Chain:
    """A registry of these servers; a test may remove one while a call goes down their chain."""

    def __init__(self, *servers: HookServerConfig) -> None:
        self.servers = list(servers)

    @property
    def snapshot(self) -> HookSnapshot:
        return HookSnapshot({s.name: s for s in self.servers})

    def servers_for(self, hook: HookType) -> tuple[HookServerConfig, ...]:
        return tuple(s for s in self.servers if hook in s.hooks)

    def on_change(self, callback: Callable[[HookSnapshot], None]) -> None:
        pass


class NoConnections:
    """A transport's connection keeping, with nothing to keep: subclasses say how a call goes."""

    def keep_only(self, endpoints: object, grace: float) -> None:
        pass

    def endpoints(self) -> frozenset[str]:
        return frozenset()

    async def close(self, grace: float) -> None:
        pass
