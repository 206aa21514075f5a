"""Dispatcher edge cases that need no hook-server process."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cri_api.hookapi import api_pb2 as hookapi
from runtimeproxy.hookpath.dispatch import Dispatcher, HookError
from runtimeproxy.hookpath.hookfile import FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.registry import HookSnapshot

HOOK = HookType.PRE_CREATE_CONTAINER


class OneServer:
    """A registry holding one hook server, whatever its file said."""

    def __init__(self, server: HookServerConfig) -> None:
        self.server = server

    def servers_for(self, hook: HookType) -> tuple[HookServerConfig, ...]:
        return (self.server,) if hook in self.server.hooks else ()

    def on_change(self, callback: Callable[[HookSnapshot], None]) -> None:
        pass


def unusable(policy: FailurePolicy) -> HookServerConfig:
    # A lone surrogate cannot be encoded: creating the channel itself fails.
    return HookServerConfig("odd.json", "/run/\udc80.sock", policy, frozenset({HOOK}), timeout=1.0)


async def build() -> hookapi.ContainerResourceHookRequest:
    return hookapi.ContainerResourceHookRequest()


async def test_unexpected_error_is_the_hooks_failure_under_fail() -> None:
    dispatcher = Dispatcher(OneServer(unusable(FailurePolicy.FAIL)))  # type: ignore[arg-type]
    with pytest.raises(HookError) as excinfo:
        await dispatcher.run_pre(HOOK, build, lambda answer: True, {})
    assert "UnicodeEncodeError" in excinfo.value.cause
    assert "odd.json" in str(excinfo.value)
    await dispatcher.close()


async def test_unexpected_error_is_skipped_under_ignore() -> None:
    dispatcher = Dispatcher(OneServer(unusable(FailurePolicy.IGNORE)))  # type: ignore[arg-type]
    assert await dispatcher.run_pre(HOOK, build, lambda answer: True, {}) is False
    await dispatcher.close()
