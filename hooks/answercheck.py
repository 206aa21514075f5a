"""What the proxy would make of a hook's answer, field by field, for a hook
author's unit tests: :func:`check_answer` (also importable from :mod:`hooks.sdk`).

It judges with the proxy's own code, not a copy of its rules: the fields a
hook point does not apply (``answers.unapplied``, the proxy's ``hook answer
not applied`` line), the values the kernel would refuse
(``answers.kernel_would_refuse``, by the node's CPUs and memory nodes and, on
cgroup v1, the pod cgroup parent's cpuset, each given or read), and whether a
field changes the call (the CRI call's executor ``apply``, one field at a time,
on kubelet's call: given, or built from the request the hook was shown; an
update as kubelet sends a resize, with no annotations and no cpusets).

It judges the CRI proxy's path (``runtime-proxy serve``). Under
``runtime-proxy nri`` less is applied: no PreRunPodSandbox answer, no
oom_score_adj, no swap limit at PreCreateContainer, nothing but resources on
an update, and no whole answer's cpuset clear (``nri/limits.py``); give
``nri=True`` to judge by the NRI plugin's own code for these.

Not judged here: what only a chain of hooks decides (a PreCreateContainer
answer refused by its parent may be lifted by a later hook's move) and what
needs the hook file (its failure policy: a refused answer fails the call
under ``Fail`` and is dropped under ``Ignore``): :func:`hooks.chaincheck.check_chain`
judges those; nor the call's transport.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from cri_api.hookapi import api_pb2 as hookapi
from hooks.checkfacts import cgroup_hierarchy, kubelet_call, node_facts
from runtimeproxy.hookpath.answers import kernel_would_refuse, refusal, unapplied
from runtimeproxy.hookpath.executor import HOOKED_METHODS
from runtimeproxy.hookpath.hookfile import Answers
from runtimeproxy.hookpath.nodefacts import NodeFactsSource
from runtimeproxy.hookpath.points import HOOK_POINTS, HookPoint, HookType, Kind
from runtimeproxy.hookpath.validate import Reason
from runtimeproxy.hookpath.wholeanswers import CLEAR_ASKED, CLEAR_KEPT
from runtimeproxy.nri.limits import APPLIED as NRI_APPLIED
from runtimeproxy.nri.limits import NRI_DROPPED
from runtimeproxy.nri.limits import unapplied as nri_unapplied

__all__ = ["AnswerCheck", "FieldCheck", "Outcome", "check_answer"]


class Outcome(enum.StrEnum):
    APPLIED = "applied"  # changes the call
    UNCHANGED = "unchanged"  # the call has it already: an echo changes nothing
    IGNORED = "ignored"  # the hook point, or its call, has no place for it
    REFUSED = "refused"  # the kernel would refuse it: the whole answer is refused
    DROPPED = "dropped"  # would change the call, but another field refuses the answer (taken whole or not at all)


@dataclass(frozen=True)
class FieldCheck:
    field: str  # "container_resources.cpu_shares", "container_envs[HOOKED_BY]", "pod_cgroup_parent"
    outcome: Outcome
    reason: str  # the proxy's words where it has some (a refusal, "hook answer not applied")


@dataclass(frozen=True)
class AnswerCheck:
    hook: HookType
    fields: tuple[FieldCheck, ...]
    refusal: str | None  # the cause the proxy logs and fails a Fail hook's call with; None: the answer is taken

    @property
    def taken(self) -> bool:
        return self.refusal is None

    @property
    def outcomes(self) -> dict[str, Outcome]:
        """Each field's outcome, by field: one assert for the whole answer."""
        return {check.field: check.outcome for check in self.fields}

    def __getitem__(self, field: str) -> FieldCheck:
        for check in self.fields:
            if check.field == field:
                return check
        raise KeyError(f"{field!r} is not judged: the answer's fields are {', '.join(self.outcomes) or 'none'}")

    def __str__(self) -> str:
        lines = [f"{self.hook.value} answer {'taken' if self.taken else 'refused: ' + str(self.refusal)}"]
        lines += [f"  {check.field}: {check.outcome} ({check.reason})" for check in self.fields]
        return "\n".join(lines)


def check_answer(
    hook: HookType | str,
    request: Message,
    answer: Message | None,
    *,
    call: Message | None = None,
    cpus: str | None = None,
    mems: str | None = None,
    cgroups: Mapping[str, Mapping[str, str]] | None = None,
    answers: Answers | str = Answers.CHANGES,
    nri: bool = False,
) -> AnswerCheck:
    """What the proxy would make of ``answer``, a hook's to ``request`` at ``hook``.

    ``call``: kubelet's CRI request the hook was called for, which the
    answer is applied to (``UpdateContainerResourcesRequest`` at
    PreUpdateContainerResources); None builds it from ``request``, an update
    as kubelet sends a resize: the resources shown but the cpusets, no
    annotations (a CPU manager's update names cpuset_cpus alone: give it to
    judge a whole answer's clear). ``cpus`` and ``mems``: the node's online
    CPUs and the memory nodes its cpuset.mems takes, as kernel lists
    ("0-3"); None reads this machine's where the answer is applied (give
    both for a test that runs anywhere). ``cgroups``: the cgroup v1 cpuset
    hierarchy the pod's cgroup parent is judged by, cgroup path ->
    {"cpuset.cpus": ..., "cpuset.mems": ...} (a slice expanded, as runc
    does: ``/kubepods.slice/kubepods-burstable.slice``); None judges no
    parent, as on cgroup v2. ``answers``: the hook file's key (``whole``: an
    empty cpuset clears the call's). ``nri``: as ``runtime-proxy nri``
    applies it.
    """
    point = HOOK_POINTS[HookType(hook)]
    executor = HOOKED_METHODS[point.cri_method].executor
    answer = point.response_type() if answer is None else answer
    for message, expected, what in ((request, point.request_type, "request"), (answer, point.response_type, "answer"),
                                    (call, executor.request, "call")):
        if message is not None and not isinstance(message, expected):
            raise TypeError(f"a {point.hook.value} {what} is a {expected.__name__}, not {type(message).__name__}")
    items = list(_items(point, answer))
    order = {item.name: index for index, item in enumerate(items)}
    found = unapplied(point, answer)
    ignored = dict.fromkeys(found[0], found[1]) if found is not None else {}
    checks = [FieldCheck(item.name, Outcome.IGNORED, ignored[item.top]) for item in items if item.top in ignored]
    items = [item for item in items if item.top not in ignored]
    reasons: list[Reason] = []
    if point.answer_applied:  # else never judged: the node is read only where it is
        facts = node_facts(cpus, mems)
        with cgroup_hierarchy(cgroups) as parents:
            reasons = kernel_would_refuse(NodeFactsSource(lambda: facts, parents=parents), point, request, answer, {})
    refused = _refused(point, items, reasons)
    checks += refused.values()
    items = [item for item in items if item.name not in refused]
    echo = f"the {point.cri_method} call has it already: an echo changes nothing"
    if nri:  # what the NRI plugin cannot apply, by its own code (an echoed key is not its map's changed one)
        dropped = {item.name for item in items if nri_unapplied(point.hook, request, item.alone)}
        checks += [FieldCheck(name, Outcome.IGNORED, NRI_DROPPED) for name in sorted(dropped)]
        items = [item for item in items if item.name not in dropped]
        never = [item for item in items if item.top not in NRI_APPLIED.get(point.hook, {item.top})]
        checks += [FieldCheck(item.name, Outcome.UNCHANGED, echo) for item in never]  # NRI applies none: an echo
        items = [item for item in items if item not in never]
    for item in items:
        if executor.apply(kubelet_call(point, request, call), item.alone, request):
            outcome, reason = Outcome.APPLIED, f"changes the {point.cri_method} call{_where(point, item)}"
            if reasons:
                outcome, reason = Outcome.DROPPED, DROPPED
        else:
            outcome, reason = Outcome.UNCHANGED, echo
        checks.append(FieldCheck(item.name, outcome, reason))
    if Answers(answers) is Answers.WHOLE and point.answer_applied:
        outcome, reason = ((Outcome.IGNORED, CLEAR_KEPT) if nri else (Outcome.DROPPED, DROPPED) if reasons
                           else (Outcome.APPLIED, CLEAR_ASKED))
        checks += [FieldCheck(f"container_resources.{name}", outcome, reason)
                   for name in executor.emptied(kubelet_call(point, request, call), answer)]
    checks.sort(key=lambda check: order.get(check.field, len(order)))  # as the answer has them
    return AnswerCheck(point.hook, tuple(checks), refusal(reasons) if reasons else None)


DROPPED = "another field's refusal refuses the answer: it is taken whole or not at all"


@dataclass(frozen=True)
class _Item:
    """One thing an answer asks: a field, a map's key or a hugepage size."""

    name: str
    top: str  # the answer's field it is in
    sub: str  # of resources, the LinuxContainerResources field; else ""
    key: str  # a map's key or a page size; else ""
    alone: Message  # an answer asking only this


def _items(point: HookPoint, answer: Message) -> Iterator[_Item]:
    for field, value in answer.ListFields():
        top = field.name
        if isinstance(value, hookapi.LinuxContainerResources):
            for sub, sub_value in value.ListFields():
                yield from _resource_items(point, top, sub.name, sub_value)
        elif field.message_type is not None:  # a map<string, string>
            for key, text in sorted(value.items()):
                alone = point.response_type()
                getattr(alone, top)[key] = text
                yield _Item(f"{top}[{key}]", top, "", key, alone)
        else:
            yield _Item(top, top, "", "", point.response_type(**{top: value}))


def _resource_items(point: HookPoint, top: str, sub: str, value: Any) -> Iterator[_Item]:
    if sub == "hugepage_limits":
        entries = [(limit.page_size, {"page_size": limit.page_size, "limit": limit.limit}) for limit in value]
    elif sub == "unified":
        entries = [(key, {key: text}) for key, text in sorted(value.items())]
    else:
        alone = point.response_type()
        setattr(getattr(alone, top), sub, value)
        yield _Item(f"{top}.{sub}", top, sub, "", alone)
        return
    for key, entry in entries:
        alone = point.response_type()
        resources = getattr(alone, top)
        if sub == "hugepage_limits":
            resources.hugepage_limits.add(**entry)
        else:
            resources.unified.update(entry)
        yield _Item(f"{top}.{sub}[{key}]", top, sub, key, alone)


def _refused(point: HookPoint, items: list[_Item], reasons: list[Reason]) -> dict[str, FieldCheck]:
    """Each reason on the items it is about (a key's by its key: ``'2M'``),
    or on the field it names when the answer did not set it (a swap limit
    below the memory limit the answer set, once merged)."""
    top = "resources" if point.kind is Kind.POD else "container_resources"
    out: dict[str, FieldCheck] = {}
    for reason in reasons:
        about = [item for item in items if item.top == top and item.sub == reason.field]
        about = [item for item in about if item.key and repr(item.key) in reason] or about
        for name in [item.name for item in about] or [f"{top}.{reason.field}"]:
            earlier = out.get(name)
            text = str(reason) if earlier is None else f"{earlier.reason}; {reason}"
            out[name] = FieldCheck(name, Outcome.REFUSED, text)
    return out


def _where(point: HookPoint, item: _Item) -> str:
    if point.kind is Kind.POD and item.top == "resources":
        return " (the pod's config: containerd passes it on as annotations, to no cgroup)"
    return ""
