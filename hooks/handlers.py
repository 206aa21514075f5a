"""Checks of a :class:`hooks.sdk.HookServer` subclass's handlers, made when the class is defined.

A handler the SDK would never call, or could not await, otherwise shows up
only at the first hook call, behind the proxy: a plain ``def`` fails every
call with ``object ... can't be used in 'await' expression``, and a method
named as a gRPC servicer's (``PreCreateContainerHook(self, request, context)``)
or as the hook point (``PreCreateContainer``) is never called, so the hook
answers "no change" without a word. Both are refused here, naming the
handler to write.
"""

from __future__ import annotations

import inspect

from runtimeproxy.hookpath.points import HOOK_POINTS

__all__ = ["check_handlers"]

# Names a handler is mistaken for, each with the handler the SDK calls.
_MISNAMED = {
    alias: point
    for point in HOOK_POINTS.values()
    for alias in (point.rpc_name, point.hook.value, point.handler_name.replace("_", ""))
}


def check_handlers(cls: type) -> None:
    """``TypeError`` for a handler of ``cls`` that is not ``async def``, or
    a method named like a hook that the SDK never calls."""
    for name, value in vars(cls).items():
        point = _MISNAMED.get(name)
        if point is not None and name != point.handler_name and callable(value):
            raise TypeError(
                f"{cls.__qualname__}.{name} is never called: the SDK calls "
                f"'async def {point.handler_name}(self, request)' for {point.hook.value}"
            )
    for name in ("handle", *(point.handler_name for point in HOOK_POINTS.values())):
        value = vars(cls).get(name)
        if value is not None and not inspect.iscoroutinefunction(value):
            raise TypeError(
                f"{cls.__qualname__}.{name} must be 'async def': the SDK awaits it, "
                "and a plain def would fail every call it answers"
            )
