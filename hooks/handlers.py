"""A hook server's handlers: :class:`HookHandlers`, ``HookServer``'s base, and their checks.

:class:`HookHandlers` holds the seven no-op handlers, one per hook point,
which answer "no change", and :meth:`HookHandlers.handle`, which picks the
handler of a hook point: a subclass overrides the ones it cares about, or
``handle`` to take every hook point generically.

The checks (:func:`check_handlers`) run as a subclass is defined. A handler the SDK would never call, or could not await, otherwise shows up
only at the first hook call, behind the proxy: a plain ``def`` fails every
call with ``object ... can't be used in 'await' expression``, and a method
named as a gRPC servicer's (``PreCreateContainerHook(self, request, context)``)
or as the hook point (``PreCreateContainer``) is never called, so the hook
answers "no change" without a word. Both are refused here, in the class or a
mixin of it, naming the handler to write. A handler the SDK may well await (a decorator's wrapper,
a callable object, a plain ``def`` returning ``super()``'s coroutine) is
not refused: it can return an awaitable, which a definition cannot tell, so
it is at most warned about.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any

from google.protobuf.message import Message

from cri_api.hookapi import api_pb2
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType

__all__ = ["HookHandlers", "check_handlers", "handled_hooks"]

# Names a handler is mistaken for, each with the handler the SDK calls.
_MISNAMED = {
    alias: point
    for point in HOOK_POINTS.values()
    for alias in (point.rpc_name, point.hook.value, point.handler_name.replace("_", ""))
}


def check_handlers(cls: type, base: type) -> None:
    """``TypeError`` for a handler of ``cls`` that is not ``async def``, or
    a method named like a hook that the SDK never calls: one of ``cls`` or
    of a mixin, a class of its MRO before ``base`` (``HookServer``)."""
    own = cls.__mro__[:cls.__mro__.index(base)]
    for klass in own:
        for name, value in vars(klass).items():
            point = _MISNAMED.get(name)
            if point is not None and name != point.handler_name and callable(value) and not isinstance(value, type):
                raise TypeError(
                    f"{klass.__qualname__}.{name} is never called: the SDK calls "
                    f"'async def {point.handler_name}(self, request)' for {point.hook.value}"
                )
    for name in ("handle", *(point.handler_name for point in HOOK_POINTS.values())):
        # The definition the SDK calls; one of an earlier HookServer subclass was checked with it.
        definer = next((klass for klass in own if name in vars(klass)), None)
        if definer is None or (definer is not cls and issubclass(definer, base)):
            continue
        klass = definer
        value = vars(klass)[name]
        function, wrapped = _unwrapped(value)
        if inspect.isasyncgenfunction(function):
            raise TypeError(
                f"{klass.__qualname__}.{name} yields: a handler returns its answer "
                "('return response', not 'yield'), and the SDK cannot await an async generator"
            )
        if inspect.iscoroutinefunction(function):
            continue
        # A decorator's wrapper may return a coroutine of a plain def, and a
        # plain def calling super() most likely returns the SDK's coroutine.
        if not callable(value) or (inspect.isfunction(function) and not wrapped
                                   and "super" not in function.__code__.co_names):
            raise TypeError(
                f"{klass.__qualname__}.{name} must be 'async def': the SDK awaits it, "
                "and a plain def would fail every call it answers"
            )
        warnings.warn(
            f"{klass.__qualname__}.{name} is not 'async def': the SDK awaits what it returns, so every call "
            "fails unless that is awaitable", RuntimeWarning, stacklevel=3)  # the class statement


def _unwrapped(value: Any) -> tuple[Any, bool]:
    """The function a handler runs, through staticmethod, partialmethod and
    ``functools.wraps`` decorators, and whether a decorator wraps it."""
    wrapped = False
    while True:
        if isinstance(value, staticmethod | classmethod):
            value = value.__func__
        elif isinstance(value, functools.partialmethod | functools.partial):
            value = value.func
        elif inspect.isfunction(value) and hasattr(value, "__wrapped__"):
            value, wrapped = inspect.unwrap(value), True
        else:
            return value, wrapped


def handled_hooks(cls: type, base: type) -> dict[HookType, str]:
    """The hook points whose handler ``cls``, or a mixin of it, defines (a
    class of its MRO before ``base``), each with that handler's name
    (``ExampleHook.pre_create_container``). One answering through ``handle``
    alone names none: which points it answers, its code decides."""
    own = cls.__mro__[:cls.__mro__.index(base)]
    handled = {}
    for point in HOOK_POINTS.values():
        klass = next((klass for klass in own if point.handler_name in vars(klass)), None)
        if klass is not None:
            handled[point.hook] = f"{klass.__qualname__}.{point.handler_name}"
    return handled


class HookHandlers:
    """The handlers of a hook server (``hooks.sdk.HookServer``'s base): each
    answers an empty response ("no change") until overridden; ``handle`` is
    the entry point of every call and dispatches to them."""

    async def pre_run_pod_sandbox(self, request: api_pb2.PodSandboxHookRequest) -> api_pb2.PodSandboxHookResponse | None:
        return None

    async def post_stop_pod_sandbox(
        self, request: api_pb2.PodSandboxHookRequest
    ) -> api_pb2.PodSandboxHookResponse | None:
        return None

    async def pre_create_container(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def pre_start_container(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def post_start_container(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def post_stop_container(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def pre_update_container_resources(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def handle(self, hook: HookType, request: Message) -> Message | None:
        """Generic entry point of every call; by default dispatches to the handler method."""
        return await getattr(self, HOOK_POINTS[hook].handler_name)(request)
