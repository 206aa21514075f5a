"""The ``noop`` built-in hook: answers every hook point with "no change".

It shows an operator that the whole hook path works (registration file,
socket, the proxy calling out) without changing any pod, and gives the bench
a hook whose own cost is nil. Each call is logged at debug level.
"""

from __future__ import annotations

import logging

from google.protobuf.message import Message

from runtimeproxy.hookpath.points import HookType

from .builtin import BuiltinHook

log = logging.getLogger(__name__)


class NoopHook(BuiltinHook):
    NAME = "noop"
    SUMMARY = "answers every hook point with no change (smoke-tests the hook path)"
    HOOKS = tuple(HookType)

    async def handle(self, hook: HookType, request: Message) -> None:
        if log.isEnabledFor(logging.DEBUG):
            pod = getattr(request, "pod_meta", None)
            container = getattr(request, "container_meta", None)
            log.debug(
                "answered no change",
                extra={
                    "hook": hook.value,
                    "pod": f"{pod.namespace}/{pod.name}" if pod is not None else None,
                    "container": container.name if container is not None else None,
                },
            )
        return None
