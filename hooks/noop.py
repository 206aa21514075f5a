"""The ``noop`` built-in hook: answers every hook point with "no change".

It shows an operator that the whole hook path works (registration file,
socket, the proxy calling out) without changing any pod, and gives the bench
a hook whose own cost is nil. Each call is logged at debug level once, by the
SDK (``hooks.calllog``: ``PreCreateContainer hook call answered in ...``,
with its pod and container).
"""

from __future__ import annotations

from google.protobuf.message import Message

from runtimeproxy.hookpath.points import HookType

from .builtin import BuiltinHook


class NoopHook(BuiltinHook):
    NAME = "noop"
    SUMMARY = "answers every hook point with no change (smoke-tests the hook path)"
    HOOKS = tuple(HookType)

    async def handle(self, hook: HookType, request: Message) -> None:
        return None
