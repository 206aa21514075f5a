"""Whole answers: the cpusets an answer from a server whose hook file says
``answers: whole`` (koordlet's, by default) clears.

koord-runtime-proxy takes an answer's cpuset_cpus and cpuset_mems whole,
empty or not: koordlet clears a BestEffort container's cpuset_cpus so that
it follows the besteffort cgroup's. Every other server's empty cpuset is
unset (kept), as for every other field; which is which is the hook file's
word, never guessed from an answer's content. Each clear is logged.

Under NRI a clear cannot be applied: containerd ignores an adjustment's empty
cpus or mems, so the container keeps kubelet's cpuset, and the call (which
the record is made from) keeps it too. That is logged once per container.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from cri_api.hookapi import api_pb2 as hookapi

from .executor import Executor
from .hookfile import Answers, HookServerConfig
from .points import HookType

log = logging.getLogger(__name__)

# Containers whose unappliable clear was logged (NRI), the oldest forgotten first.
_REMEMBERED = 4096


class WholeAnswers:
    def __init__(self, applies: bool = True) -> None:
        # False under NRI, which cannot clear a cpuset.
        self.applies = applies
        self._told: OrderedDict[tuple[str, str, int], None] = OrderedDict()

    def clears(
        self, ex: Executor, req: Any, answer: Any, server: HookServerConfig, shown: Any, hook: HookType,
        fields: dict[str, object],
    ) -> tuple[str, ...]:
        """The cpusets of ``req`` to clear for ``server``'s ``answer``."""
        if server.answers is not Answers.WHOLE:
            return ()
        names = ex.emptied(req, answer)
        if not names:
            return ()
        extra = {**fields, **_container(shown), "hook": hook.value, "hook_file": server.name, "cpuset_fields": list(names)}
        if self.applies:
            log.info("whole hook answer clears the container's cpuset", extra=extra)
            return names
        key = _key(shown)
        if key not in self._told:
            self._told[key] = None
            if len(self._told) > _REMEMBERED:
                self._told.popitem(last=False)
            log.info("whole hook answer clears the container's cpuset; NRI cannot clear one, so it is kept", extra=extra)
        return ()


def _container(shown: Any) -> dict[str, object]:
    if not isinstance(shown, hookapi.ContainerResourceHookRequest):
        return {}
    pod = shown.pod_meta
    out: dict[str, object] = {"pod": f"{pod.namespace}/{pod.name}", "container": shown.container_meta.name}
    if shown.container_meta.id:
        out["container_id"] = shown.container_meta.id
    return out


def _key(shown: Any) -> tuple[str, str, int]:
    if not isinstance(shown, hookapi.ContainerResourceHookRequest):
        return ("", "", 0)
    return (shown.pod_meta.uid, shown.container_meta.name, shown.container_meta.attempt)
