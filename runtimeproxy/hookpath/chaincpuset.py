"""A chain of PreCreateContainer hooks judged by the pod cgroup parent's
cpuset (cgroup v1, validate.outside_parent) as the call leaves the chain, not
only answer by answer. The rules, their reasons and the three prices where
the outcome differs from runc's are told once, in docs/hook-files.md
("cgroup v1: cpusets and the pod's parent"); here, how they are kept:

 * ``taken_along``: the cpusets earlier hooks set (``_set_by``) that a move
   leaves, judged by its new parent; none for an Ignore move with hooks
   still to come, nor those its answer clears (``cleared``, the executor's rule).
 * ``defer``: a Fail answer refused only by its parent, with hooks still to
   come, is taken (``Deferred``) until the chain's end; ``standing`` judges
   it again then, by the call as the chain left it, for its cpusets still
   its doing.
 * ``taken``: each applied answer's cpusets, the hook that set each, the
   parent and the hook that moved the container last.

Ignore answers are not deferred: dropping one after later hooks ran would
take out of the call what those hooks saw and answered on; undoing it
soundly means replaying and judging again every later answer, where a Fail
refusal fails the call and undoes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .hookfile import Answers, FailurePolicy, HookServerConfig
from .merge import emptied_cpusets
from .nodefacts import NodeFactsSource
from .validate import NODE_FIELDS, OutsideParent, Reason, set_by

log = logging.getLogger(__name__)


def noted(reasons: list[Reason], along: dict[str, str]) -> list[Reason]:
    """``reasons`` with those about a cpuset an earlier hook set, which this
    answer's move takes along (``along``, field: hook file), naming that hook."""
    return [
        r.noted(f", set by {along[r.field]} earlier in the chain and taken along by this answer's move")
        if isinstance(r, OutsideParent) and r.field in along else r
        for r in reasons
    ]


@dataclass(eq=False)  # each its own answer: matched by identity
class Deferred:
    """A Fail answer refused only by its parent, taken until the chain's end."""

    server: HookServerConfig
    fields: frozenset[str]  # the cpusets refused: judged again at the end, while still this answer's doing
    along: dict[str, str]  # those of them an earlier hook set that its move took along (field: hook file)
    moved: bool  # it moved the container: judged again only while its parent is the call's
    seconds: float  # its call's time: counted, with its outcome, at the chain's end
    counted: bool = False


class ChainCpusets:
    """One PreCreateContainer chain's cpusets and parent, as its answers leave them."""

    def __init__(self, log_fields: dict[str, object], clears: bool = True) -> None:
        self.log_fields = log_fields  # the call's (method, pod or container)
        self.clears = clears  # whether a whole answer's empty cpusets clear the call's (False under NRI)
        self.later = False  # a server comes after the one being called: its refusal may wait
        self.deferred: list[Deferred] = []
        self._set_by: dict[str, str] = {}  # cpuset field: the hook file that last set it in this chain
        self._values: dict[str, str] = {}
        self._parent = ""
        self._moved_by = ""  # the hook file that last moved the container in this chain

    def cleared(self, server: HookServerConfig, request: Any, answer: Any) -> tuple[str, ...]:
        """The cpusets of the call ``answer`` clears, as the executor clears
        them (Executor.emptied): a whole answer's empty ones, where they clear,
        and only of an answer with container_resources (koord-runtime-proxy
        takes an answer's resources only when it has them: one without clears
        nothing, and its move takes the cpusets along)."""
        if not self.clears or server.answers is not Answers.WHOLE or not answer.HasField("container_resources"):
            return ()
        return emptied_cpusets(request.container_resources, answer.container_resources)

    def taken_along(self, server: HookServerConfig, request: Any, answer: Any) -> dict[str, str]:
        """The cpusets earlier hooks set (field: hook file) that ``answer``
        leaves, moving the container: judged by its new parent. Not those it
        clears (a whole answer's empty ones), nor an Ignore answer's with
        hooks still to come: dropped then, it would be for a cpuset a later
        hook may still set again (the chain's end judges the deferred answers
        by the parent it leaves)."""
        if not answer.pod_cgroup_parent or answer.pod_cgroup_parent == request.pod_cgroup_parent:
            return {}
        if self.later and server.failure_policy is FailurePolicy.IGNORE:
            return {}
        leaves = NODE_FIELDS.difference(set_by(request.container_resources, answer.container_resources),
                                        self.cleared(server, request, answer))
        return {field: name for field, name in self._set_by.items() if field in leaves}

    def taken(self, server: HookServerConfig, request: Any, answer: Any) -> None:
        """``answer`` was merged into the call (as merge_resources does: a value
        set wins); the cpusets it cleared (``cleared``) are no hook's any more,
        judged empty at the chain's end."""
        shown, answered = request.container_resources, answer.container_resources
        cleared, sets = self.cleared(server, request, answer), set_by(shown, answered)  # an echo is not the hook's doing
        for field in NODE_FIELDS:
            if field in cleared:
                self._values[field] = ""
                self._set_by.pop(field, None)
                continue
            if field in sets:
                self._set_by[field] = server.name
            self._values[field] = getattr(answered, field) or getattr(shown, field)
        if answer.pod_cgroup_parent and answer.pod_cgroup_parent != request.pod_cgroup_parent:
            self._moved_by = server.name
        self._parent = answer.pod_cgroup_parent or request.pod_cgroup_parent

    def defers(self, server: HookServerConfig, reasons: list[Reason]) -> bool:
        return (
            self.later and server.failure_policy is FailurePolicy.FAIL and bool(reasons)
            and all(isinstance(reason, OutsideParent) for reason in reasons)
        )

    def defer(
        self, server: HookServerConfig, request: Any, answer: Any, reasons: list[Reason], along: dict[str, str],
        seconds: float,
    ) -> None:
        fields = frozenset(r.field for r in reasons)
        moved = answer.pod_cgroup_parent not in ("", request.pod_cgroup_parent)
        self.deferred.append(Deferred(server, fields, {f: along[f] for f in fields & along.keys()}, moved, seconds))
        log.debug("answer outside its parent cgroup taken until the chain's end: a later hook may move the container",
                  extra={**self.log_fields, **server.log_fields(), "error": "; ".join(reasons)})

    def standing(self, node: NodeFactsSource) -> list[tuple[Deferred, list[Reason]]]:
        """The deferred refusals that stand by the call as the chain left it, in
        chain order, with their reasons: each judged again, by the parent read
        now (one widened during the chain is taken), for its cpusets still its
        doing: those no later hook set again (or cleared), of one that moved the
        container only while no later hook moved it elsewhere (that move took
        them along, and was judged for them itself, or not: an Ignore move
        with hooks after it). Else the later hook's answer is the one to judge."""
        out = []
        for entry in self.deferred:
            if entry.moved and self._moved_by != entry.server.name:
                continue
            values = {
                field: self._values[field] for field in entry.fields
                if self._set_by.get(field) == entry.along.get(field, entry.server.name)
            }
            reasons = noted(node.outside(self._parent, values), entry.along) if values else []
            if reasons:
                out.append((entry, reasons))
        return out
