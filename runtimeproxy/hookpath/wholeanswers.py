"""Whole answers: the cpusets an answer from a server whose hook file says
``answers: whole`` (koordlet's, by default) clears.

koord-runtime-proxy takes an answer's cpuset_cpus and cpuset_mems whole,
empty or not: koordlet clears a BestEffort container's cpuset_cpus so that
it follows the besteffort cgroup's. Every other server's empty cpuset is
unset (kept), as for every other field; which is which is the hook file's
word, never guessed from an answer's content.

Under NRI a clear cannot be applied: containerd ignores an adjustment's empty
cpus or mems, so the container keeps kubelet's cpuset, and the call (which
the record is made from) keeps it too.

Each clear is logged at info the first time for its container and field,
then at debug: a backend refusing an update has kubelet send it again every
10 s, each answered alike. The line comes before the backend call, so it
says what is asked, not what was done.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from cri_api.hookapi import api_pb2 as hookapi

from .hookfile import Answers, HookServerConfig
from .points import HookType

log = logging.getLogger(__name__)

# The line of a clear (hooks.answercheck tells a hook's author so too).
CLEAR_ASKED = "whole hook answer asks the runtime to clear the container's cpuset"
# The line of a clear under NRI, which cannot apply one.
CLEAR_KEPT = "whole hook answer clears the container's cpuset; NRI cannot clear one, so it is kept"
# Containers and fields whose clear was logged at info, the oldest forgotten first.
_REMEMBERED = 4096


class WholeAnswers:
    def __init__(self, applies: bool = True) -> None:
        # False under NRI, which cannot clear a cpuset.
        self.applies = applies
        self._told: OrderedDict[tuple[str, str, int, str], None] = OrderedDict()

    def cleared(
        self, names: tuple[str, ...], server: HookServerConfig, shown: Any, hook: HookType, fields: dict[str, object],
    ) -> tuple[str, ...]:
        """Of the cpusets ``names`` an answer leaves empty (Executor.emptied),
        those to clear for ``server`` (a chain judges the same ones cleared:
        ChainCpusets.cleared), logged."""
        if server.answers is not Answers.WHOLE or not names:
            return ()
        extra = {**fields, **_container(shown), "hook": hook.value, "hook_file": server.name, "cpuset_fields": list(names)}
        level = logging.INFO if self._first(shown, names) else logging.DEBUG
        if self.applies:
            log.log(level, CLEAR_ASKED, extra=extra)
            return names
        log.log(level, CLEAR_KEPT, extra=extra)
        return ()

    def _first(self, shown: Any, names: tuple[str, ...]) -> bool:
        """Whether a clear of any of ``names`` is the first logged for its container."""
        container = _key(shown)
        new = [(*container, name) for name in names if (*container, name) not in self._told]
        for key in new:
            self._told[key] = None
        while len(self._told) > _REMEMBERED:
            self._told.popitem(last=False)
        return bool(new)


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
