"""Moving data between CRI v1 requests and hook messages, and merging answers.

Only these can change through a hook: labels, annotations, cgroup parent,
Linux resources and env. A value a hook leaves unset (zero, empty) keeps the
original (but an empty cpuset from a server whose answers are whole clears:
:func:`emptied_cpusets`); maps merge by key, and so do hugepage limits by page size; env keeps its order, a hook's variable replaces
one of the same name or is appended. Nothing else of a request is reachable
from here, so no hook can grant privileges, mounts, devices or namespaces.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from google.protobuf.message import Message

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1

# Same names in the CRI and hook messages.
_RESOURCE_NUMBERS = (
    "cpu_period",
    "cpu_quota",
    "cpu_shares",
    "memory_limit_in_bytes",
    "oom_score_adj",
    "memory_swap_limit_in_bytes",
)
# The strings, the cpusets: validate.NODE_FIELDS, what a whole answer clears.
CPUSETS = ("cpuset_cpus", "cpuset_mems")


def hook_resources(resources: v1.LinuxContainerResources) -> hookapi.LinuxContainerResources:
    out = hookapi.LinuxContainerResources()
    copy_as_wire(out, resources)
    return out


def copy_as_wire(target: Message, source: Message) -> None:
    """``source`` into the empty ``target``, which is then present even if
    empty: for CRI and hook messages with the same fields under the same
    numbers (resources, pod metadata; tests/unit/hookpath/test_records.py
    holds them to it). Copied as wire bytes, in C, not field by field in
    Python: pod and container records are built on a call's path. Fields
    the hook API does not know are dropped."""
    target.MergeFromString(source.SerializeToString())
    target.SetInParent()
    target.DiscardUnknownFields()


def merge_resources(target: Any, update: hookapi.LinuxContainerResources) -> bool:
    """Apply what ``update`` sets onto ``target`` (CRI or hook resources)."""
    changed = False
    for name in _RESOURCE_NUMBERS + CPUSETS:
        value = getattr(update, name)
        if value and getattr(target, name) != value:
            setattr(target, name, value)
            changed = True
    changed = merge_hugepages(target.hugepage_limits, update.hugepage_limits) or changed
    return merge_map(target.unified, update.unified) or changed


def emptied_cpusets(target: Any, answer: hookapi.LinuxContainerResources) -> tuple[str, ...]:
    """The cpusets ``target`` sets that ``answer`` leaves empty: what an
    answer read whole (its hook file's ``answers: whole``) clears, as
    koord-runtime-proxy takes an answer's cpuset_cpus and cpuset_mems whole,
    empty or not. Any other answer's empty cpuset is unset, as for every
    other field: never guessed from what the answer holds."""
    return tuple(name for name in CPUSETS if getattr(target, name) and not getattr(answer, name))


def clear_cpusets(target: Any, names: tuple[str, ...]) -> bool:
    """Empty the cpusets ``names`` of ``target`` (from ``emptied_cpusets``); True if one was set."""
    cleared = [name for name in names if getattr(target, name)]
    for name in cleared:
        setattr(target, name, "")
    return bool(cleared)


def changed_from(shown: hookapi.LinuxContainerResources, answer: hookapi.LinuxContainerResources) -> hookapi.LinuxContainerResources:
    """What ``answer`` sets that differs from what the hook was ``shown``: a
    value it echoed is not its change (an update that carried the container's
    other values along could fail where the update alone would not)."""
    out = hookapi.LinuxContainerResources()
    out.CopyFrom(answer)
    for name in _RESOURCE_NUMBERS + CPUSETS:
        if getattr(out, name) == getattr(shown, name):
            out.ClearField(name)
    seen = {(h.page_size, h.limit) for h in shown.hugepage_limits}
    kept = [h for h in out.hugepage_limits if (h.page_size, h.limit) not in seen]
    del out.hugepage_limits[:]
    out.hugepage_limits.extend(kept)
    for key in [k for k, v in out.unified.items() if shown.unified.get(k) == v]:
        del out.unified[key]
    return out


def merge_hugepages(target: Any, update: Any) -> bool:
    """By page size, like a map: a limit for a page size replaces that size's, a
    new size is appended, sizes the update does not name keep theirs. (Where
    containerd applies an update, it appends to the spec's list, and runc writes
    each in turn, so the last for a size is what holds: the same outcome.)"""
    changed = False
    for wanted in update:
        # Every entry of the size: a list echoed from a spec containerd
        # appended to may name one twice, and runc's last write would win.
        current = [h for h in target if h.page_size == wanted.page_size]
        if not current:
            target.add(page_size=wanted.page_size, limit=wanted.limit)
            changed = True
        for entry in current:
            if entry.limit != wanted.limit:
                entry.limit = wanted.limit
                changed = True
    return changed


def merge_map(target: MutableMapping[str, str], update: Mapping[str, str]) -> bool:
    changed = False
    for key, value in update.items():
        if target.get(key) != value:
            target[key] = value
            changed = True
    return changed


def merge_cgroup_parent(linux: v1.LinuxPodSandboxConfig, parent: str) -> bool:
    """A hook's pod cgroup parent onto the pod's config (an empty one keeps
    the original); for RunPodSandbox and for CreateContainer's sandbox_config,
    under whose parent containerd places the container's cgroup."""
    if not parent or parent == linux.cgroup_parent:
        return False
    linux.cgroup_parent = parent
    return True


def env_map(envs: Any) -> dict[str, str]:
    """Env as hooks see it. Values that are not UTF-8 are left out: the hook
    API carries strings, and a hook cannot echo back what it never saw."""
    out: dict[str, str] = {}
    for kv in envs:
        try:
            out[kv.key] = kv.value.decode() if isinstance(kv.value, bytes) else kv.value
        except UnicodeDecodeError:
            continue
    return out


def merge_env(envs: Any, update: Mapping[str, str]) -> bool:
    """Override by name in place, append new names (in name order)."""
    changed = False
    seen: set[str] = set()
    for kv in envs:
        if kv.key in update:
            seen.add(kv.key)
            value = update[kv.key].encode()
            if kv.value != value:
                kv.value = value
                changed = True
    for key in sorted(set(update) - seen):
        envs.add(key=key, value=update[key].encode())
        changed = True
    return changed
