"""What the hook path makes of one hook's answer before it is applied: the
fields its hook point does not apply, and the values the kernel would refuse.

The dispatcher judges every answer by these, and ``hooks.answercheck`` a hook
author's in a unit test: one rule for both, no copy.
"""

from __future__ import annotations

from typing import Any

from .chaincpuset import noted
from .nodefacts import NodeFactsSource
from .points import HookPoint, HookType, Kind
from .validate import Reason

__all__ = ["UNAPPLIED_FIELDS", "kernel_would_refuse", "refusal", "unapplied"]

# Fields of an applied answer that its call has no place for (executor.py's apply drops them), and why.
UNAPPLIED_FIELDS = {HookType.PRE_UPDATE_CONTAINER_RESOURCES: (
    frozenset({"container_envs", "pod_cgroup_parent"}), "UpdateContainerResources carries neither env nor a cgroup parent")}


def unapplied(point: HookPoint, answer: Any) -> tuple[list[str], str] | None:
    """The fields of ``answer`` that ``point`` does not apply (none of a post
    hook's or PreStartContainer's; those its call has no place for), sorted,
    and the line the proxy logs them with; None when it sets none of them."""
    ignored, why = UNAPPLIED_FIELDS.get(point.hook, (None, ""))
    if ignored is None and point.answer_applied:
        return None  # it applies every field
    # Unknown fields alone (a newer proto's) set nothing.
    fields = sorted(field.name for field, _ in answer.ListFields() if ignored is None or field.name in ignored)
    if not fields:
        return None
    if ignored is not None:
        return fields, f"hook answer not applied: {point.hook.value} answers' {', '.join(sorted(ignored))} are not ({why})"
    why = ("StartContainer carries nothing to change" if point.hook is HookType.PRE_START_CONTAINER
           else f"{point.cri_method} was already answered")
    return fields, f"hook answer not applied: no {point.hook.value} answer is ({why})"


def kernel_would_refuse(
    node: NodeFactsSource | None, point: HookPoint, request: Any, answer: Any, along: dict[str, str]
) -> list[Reason]:
    """Why the kernel would refuse what ``answer`` asks of the call ``request``
    shows, judged by ``node`` (None: not judged); ``along``: the cpusets an
    earlier hook of a PreCreateContainer chain set that its move takes along
    (field: hook file, chaincpuset.py)."""
    if node is None or not point.answer_applied:
        return []  # an answer never applied cannot fail the container
    if point.kind is Kind.POD:
        # Not judged by the parent cgroup's cpuset: containerd passes a
        # pod's resources on as annotations, to no cgroup.
        return node.invalid_answer(request.resources, answer.resources)
    # The cpusets this answer sets are judged by the parent in effect after
    # it: only CreateContainer takes a new one (its container is made under
    # it). Those it leaves are not, but for an earlier hook's that its move
    # takes along (``along``, chaincpuset.py): kubelet's is not a hook's
    # doing, and a later hook in the chain may still set it, or move the container.
    parent = request.pod_cgroup_parent
    if point.hook is HookType.PRE_CREATE_CONTAINER and answer.pod_cgroup_parent:
        parent = answer.pod_cgroup_parent
    reasons = node.invalid_answer(request.container_resources, answer.container_resources, parent, frozenset(along))
    return noted(reasons, along)


def refusal(reasons: list[Reason]) -> str:
    """The cause a hook's failure is logged and a Fail hook's call refused with."""
    return f"answer carries values the kernel would refuse: {'; '.join(reasons)}"

