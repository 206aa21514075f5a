"""Values the kernel (or runc on its behalf) would refuse in a hook's answer,
and in the resources that answer leaves once merged into the call.

A hook answer that decodes fine can still carry a value no cgroup takes: a
negative quota other than -1, a cpuset naming CPUs this node does not have,
a swap limit below the memory limit it is merged with. Sent on, such a value
fails the container start deep in runc with an error that names neither the
hook nor the field. `invalid_resources` names them up front, so the hook path
can refuse the answer (Fail) or drop it (Ignore) with a clear reason. Limits
the kernel takes are not judged: a memory limit above the node's memory is
one (limits overcommit, and kubelet sends such limits itself).

Pure: the node's facts come in as `NodeFacts` (`read_node_facts()` reads
this node's, a `NodeFactsReader` again and again, `nodefacts.py` keeps them
current; tests build their own), and a container's parent cgroup's cpuset as
`ParentCpuset` (`parentcpuset.py` reads it, cgroup v1 only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cri_api.hookapi import api_pb2 as hookapi

from .merge import CPUSETS, merge_resources

__all__ = [
    "NODE_FIELDS", "NodeFacts", "NodeFactsReader", "OutsideParent", "ParentCpuset", "ParentSet", "Reason", "format_id_list",
    "invalid_answer", "invalid_resources", "outside_parent", "parse_id_list", "read_node_facts", "set_by",
]

# Kernel bounds (kernel/sched/core.c, mm/memcontrol.c, include/linux/oom.h).
CFS_PERIOD_MIN_US = 1_000
CFS_PERIOD_MAX_US = 1_000_000
CFS_QUOTA_MIN_US = 1_000
CPU_SHARES_MIN = 2
CPU_SHARES_MAX = 262_144
OOM_SCORE_ADJ_MIN = -1_000
OOM_SCORE_ADJ_MAX = 1_000
UNLIMITED = -1
# A cgroup v2 file name as `unified` keys must be: "<controller>.<file>", nothing that walks
# paths (the file part may have capitals: hugetlb.2MB.max).
_UNIFIED_KEY = re.compile(r"^[a-z][a-z0-9_]*\.[A-Za-z0-9_.]+$")
_HUGEPAGE_SIZE = re.compile(r"^[0-9]+[KMG]B$")
_ID_RANGE = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")
# A cpuset of more ids than this is not a node's: refuse instead of building a huge set.
_MAX_IDS = 1 << 16
# The fields judged by the node's facts (the cpusets): a fresh read can change only reasons about these.
NODE_FIELDS = frozenset(CPUSETS)


class Reason(str):
    """Why the kernel would refuse a value, a str ("cpu_quota -5 is ...") that
    also names the ``field`` of LinuxContainerResources it is about."""

    field: str

    def __new__(cls, field: str, what: str) -> Reason:
        reason = super().__new__(cls, f"{field} {what}")
        reason.field = field
        return reason

    def once_merged(self) -> Reason:
        return Reason(self.field, f"{self[len(self.field) + 1:]}, once merged")

    def noted(self, note: str) -> Reason:
        """The same reason, of the same kind, with ``note`` appended."""
        return type(self)(self.field, f"{self[len(self.field) + 1:]}{note}")


class OutsideParent(Reason):
    """A cpuset outside the parent cgroup's (``outside_parent``): the one reason
    a later PreCreateContainer hook in the chain can still undo, by moving the
    container or setting the cpuset again (chaincpuset.py)."""


@dataclass(frozen=True)
class NodeFacts:
    """What the node has: online CPU ids, and the node ids cpuset.mems takes
    (``memory_nodes``; ``beyond_memory_nodes`` says what the others are, for the reason).
    ``memory_nodes_fixed_at_boot``: the kernel took its set at boot and hotplug
    adds no node to it (cgroup v2 before 5.18, see _memory_nodes), so a later
    read must not widen ``memory_nodes`` (nodefacts.py keeps them within the
    first read's)."""

    online_cpus: frozenset[int]
    memory_nodes: frozenset[int]
    beyond_memory_nodes: str = "without memory"
    memory_nodes_fixed_at_boot: bool = False


@dataclass(frozen=True)
class ParentSet:
    """The ids in a parent cgroup's cpuset file, and the cgroup they were read
    at: the parent itself, or its nearest ancestor when the parent does not
    exist yet or has the file empty (runc copies such a cgroup's from its own
    parent before it writes the container's), unreadable or no list of ids
    (never tighter than the parent's: on v1 a child's set lies within its
    parent's)."""

    ids: frozenset[int]
    read_at: str


@dataclass(frozen=True)
class ParentCpuset:
    """The cpuset of the cgroup a container's cgroup is made under, on cgroup
    v1: ``cgroup`` its path in the cpuset hierarchy, ``cpus`` and ``mems``
    from its cpuset.cpus and cpuset.mems (None: not read, not judged)."""

    cgroup: str
    cpus: ParentSet | None
    mems: ParentSet | None


def parse_id_list(text: str) -> frozenset[int]:
    """The ids of a kernel list ("0-3,8,10-11"); ValueError if it is not one."""
    ids: set[int] = set()
    for part in text.strip().split(","):
        match = _ID_RANGE.match(part.strip())
        if match is None:
            raise ValueError(f"{part!r} is not a number or a range")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ValueError(f"range {part!r} runs backwards")
        if last - first + len(ids) >= _MAX_IDS:
            raise ValueError(f"more than {_MAX_IDS} ids")
        ids.update(range(first, last + 1))
    return frozenset(ids)


def read_node_facts(root: Path = Path("/")) -> NodeFacts:
    """This node's facts, from /sys and /proc under ``root``."""
    return NodeFactsReader(root)()


_FIXED = ("cgroup mode", "kernel release")  # NodeFactsReader's, read once


class NodeFactsReader:
    """Reads this node's facts under ``root`` each time it is called; what
    no hotplug changes while the process runs (whether cpuset is on cgroup
    v2, the kernel release) is read once, as it is made, and kept once read:
    a read that failed (EMFILE, say) gives the stricter rule for now and is
    tried again at the next call, not kept for the process's life.
    ``unread``: what is still not read (nodefacts.py says what a read
    whose facts it took read at last: they may change then with no
    hotplug)."""

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root
        self.cpuset_on_v2: bool | None = None  # None: not read yet
        self.since_5_18: bool | None = None
        self._read_fixed()

    @property
    def unread(self) -> tuple[str, ...]:
        values = (self.cpuset_on_v2, self.since_5_18)
        return tuple(name for name, value in zip(_FIXED, values, strict=True) if value is None)

    def _read_fixed(self) -> None:
        if self.cpuset_on_v2 is None:
            self.cpuset_on_v2 = _cpuset_on_v2(self.root)
        if self.since_5_18 is None:
            self.since_5_18 = _kernel_at_least(self.root, (5, 18))

    def __call__(self) -> NodeFacts:
        self._read_fixed()
        cpus = parse_id_list((self.root / "sys/devices/system/cpu/online").read_text())
        mems, beyond, fixed = _memory_nodes(self.root, bool(self.cpuset_on_v2), bool(self.since_5_18))
        return NodeFacts(online_cpus=cpus, memory_nodes=mems, beyond_memory_nodes=beyond,
                         memory_nodes_fixed_at_boot=fixed)


def _memory_nodes(root: Path, on_v2: bool, since_5_18: bool) -> tuple[frozenset[int], str, bool]:
    """The nodes cpuset.mems takes (kernel/cgroup/cpuset.c, update_nodemask: a
    subset of top_cpuset.mems_allowed, else EINVAL), what the others are, and
    whether the kernel fixed that set at boot.

    cgroup v1: top_cpuset.mems_allowed is the nodes with memory (N_MEMORY,
    has_memory; older kernels lack the file: the online nodes). cgroup v2:
    cpuset_bind sets it to every possible node; before 5.18 (commit
    2685027fca38, merged after 5.18-rc5) cpuset_init_smp then put N_MEMORY
    back at boot. Stable kernels got that fix too, but a release string
    cannot show a backport, so on v2 a kernel older than 5.18-rc6 keeps the
    v1 rule: never looser than the kernel at boot (there, a memory node
    hot-added later is still refused by the kernel: v2 hotplug leaves
    mems_allowed alone, hence the flag). v1 mounted with cpuset_v2_mode gets
    the v1 rule: stricter, so safe. Without NUMA support there is no node
    directory: node 0 only.
    """
    node_dir = root / "sys/devices/system/node"
    fixed = on_v2 and not since_5_18
    if on_v2 and not fixed and (node_dir / "possible").exists():
        return parse_id_list((node_dir / "possible").read_text()), "this node cannot have", False
    if (node_dir / "has_memory").exists():
        beyond = "without memory now or at start (cgroup v2 before Linux 5.18)" if fixed else "without memory"
        return parse_id_list((node_dir / "has_memory").read_text()), beyond, fixed
    if (node_dir / "online").exists():
        return parse_id_list((node_dir / "online").read_text()), "this node does not have online", fixed
    return frozenset({0}), "other than 0 (no NUMA)", False


_FIX_RC = 6  # 2685027fca38 reached mainline between 5.18-rc5 and -rc6


def _cpuset_on_v2(root: Path) -> bool | None:
    """Whether the cpuset controller is on the unified hierarchy: the v2 root
    lists the controllers no v1 hierarchy holds (hybrid mode has no such file
    at /sys/fs/cgroup; in a cgroup namespace, those given to it). Not there
    or not listed: False, the stricter rule; None when it could not be read
    (EMFILE, EACCES...), which its caller takes as False for now."""
    try:
        return "cpuset" in (root / "sys/fs/cgroup/cgroup.controllers").read_text().split()
    except FileNotFoundError:
        return False
    except OSError:
        return None


def _kernel_at_least(root: Path, version: tuple[int, int]) -> bool | None:
    """Whether the running kernel is ``version`` or later; a release
    candidate of ``version`` itself counts only from rc6 (see _memory_nodes).
    None when the release could not be read (not there: False)."""
    try:
        release = (root / "proc/sys/kernel/osrelease").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return None
    match = re.match(r"(\d+)\.(\d+)(?:\.\d+)?(?:-rc(\d+))?", release)
    if match is None:
        return False
    found = (int(match.group(1)), int(match.group(2)))
    if found == version and match.group(3) is not None:
        return int(match.group(3)) >= _FIX_RC
    return found >= version


def invalid_resources(resources: hookapi.LinuxContainerResources, node: NodeFacts) -> list[Reason]:
    """Why the kernel would refuse these resources; empty if it would take them.

    Zero means "unset" in CRI, and -1 "unlimited" where the kernel has it.
    """
    reasons: list[Reason] = []
    r = resources
    if r.cpu_period and not CFS_PERIOD_MIN_US <= r.cpu_period <= CFS_PERIOD_MAX_US:
        reasons.append(Reason("cpu_period", f"{r.cpu_period} is outside {CFS_PERIOD_MIN_US}..{CFS_PERIOD_MAX_US} µs"))
    if r.cpu_quota and r.cpu_quota != UNLIMITED and r.cpu_quota < CFS_QUOTA_MIN_US:
        what = "negative and not -1 (unlimited)" if r.cpu_quota < 0 else f"below the kernel's {CFS_QUOTA_MIN_US} µs"
        reasons.append(Reason("cpu_quota", f"{r.cpu_quota} is {what}"))
    if r.cpu_shares and not CPU_SHARES_MIN <= r.cpu_shares <= CPU_SHARES_MAX:
        reasons.append(Reason("cpu_shares", f"{r.cpu_shares} is outside {CPU_SHARES_MIN}..{CPU_SHARES_MAX}"))
    reasons += _memory_reasons(r)
    if not OOM_SCORE_ADJ_MIN <= r.oom_score_adj <= OOM_SCORE_ADJ_MAX:
        bounds = f"{OOM_SCORE_ADJ_MIN}..{OOM_SCORE_ADJ_MAX}"
        reasons.append(Reason("oom_score_adj", f"{r.oom_score_adj} is outside {bounds}"))
    reasons += _set_reasons("cpuset_cpus", r.cpuset_cpus, node.online_cpus, "CPUs this node does not have online")
    reasons += _set_reasons("cpuset_mems", r.cpuset_mems, node.memory_nodes, f"memory nodes {node.beyond_memory_nodes}")
    for limit in r.hugepage_limits:
        if not _HUGEPAGE_SIZE.match(limit.page_size):
            reasons.append(Reason("hugepage_limits", f"page_size {limit.page_size!r} is not a size like 2MB or 1GB"))
    for key in r.unified:
        if not _UNIFIED_KEY.match(key):
            reasons.append(Reason("unified", f"key {key!r} is not a cgroup file name like memory.high"))
    return reasons


def invalid_answer(
    shown: hookapi.LinuxContainerResources, answer: hookapi.LinuxContainerResources, node: NodeFacts
) -> list[Reason]:
    """Why the kernel would refuse a hook's ``answer``, alone or merged into the
    resources the hook was ``shown`` (a swap limit below a memory limit the
    answer left alone); what ``shown`` already had, echoed or not, is not the
    answer's doing."""
    if not answer.ListFields():  # most answers set no resources: nothing to judge
        return []
    alone = invalid_resources(answer, node)
    merged = hookapi.LinuxContainerResources()
    merged.CopyFrom(shown)
    changed = merge_resources(merged, answer)
    if not alone and not changed:
        return []
    before = set(invalid_resources(shown, node))
    reasons = [reason for reason in alone if reason not in before]
    if reasons or not changed:
        return reasons
    return [reason.once_merged() for reason in invalid_resources(merged, node) if reason not in before]


def set_by(shown: hookapi.LinuxContainerResources, answer: hookapi.LinuxContainerResources) -> frozenset[str]:
    """The cpusets ``answer`` sets: to other than it was ``shown``. An echo of
    the shown value (Koordinator-style hooks send the full resources back) is
    not its doing, nor one it leaves empty, even on a move (that one it takes
    along, chaincpuset.py)."""
    return frozenset(field for field in CPUSETS if getattr(answer, field) not in ("", getattr(shown, field)))


def outside_parent(
    shown: hookapi.LinuxContainerResources, answer: hookapi.LinuxContainerResources, parent: ParentCpuset,
) -> list[Reason]:
    """Why the kernel would refuse the cpusets of ``answer``, merged into what
    the hook was ``shown``, under ``parent``: on cgroup v1 a cpuset must be a
    subset of its parent's (kernel/cgroup/cpuset.c, the legacy validate_change:
    EACCES). Only the cpusets the answer sets to other than it was shown are
    its doing: one it left (or echoed) is not judged, even under a parent the
    answer moved the container to. A cpuset that is no list of ids is
    ``invalid_resources``' to name."""
    reasons: list[Reason] = []
    sets = set_by(shown, answer)
    for name, allowed, what in (("cpuset_cpus", parent.cpus, "CPUs"), ("cpuset_mems", parent.mems, "memory nodes")):
        if allowed is None or name not in sets:
            continue
        text = getattr(answer, name)
        try:
            ids = parse_id_list(text)
        except ValueError:
            continue
        missing = sorted(ids - allowed.ids)
        if missing:
            shown_ids = _first_ids(missing)
            has = format_id_list(allowed.ids) or "none"
            has = f"it has {has}" if allowed.read_at == parent.cgroup else f"it will have {has}, from {allowed.read_at}"
            reasons.append(OutsideParent(
                name, f"{text[:64]!r} names {what} outside the parent cgroup {parent.cgroup} ({shown_ids}; {has})"
            ))
    return reasons


def format_id_list(ids: Iterable[int]) -> str:
    """A kernel id list ("0-3,8"), the form ``parse_id_list`` reads."""
    runs: list[list[int]] = []
    for i in sorted(set(ids)):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _memory_reasons(r: hookapi.LinuxContainerResources) -> list[Reason]:
    reasons = []
    for name in ("memory_limit_in_bytes", "memory_swap_limit_in_bytes"):
        value = getattr(r, name)
        if value < 0 and value != UNLIMITED:
            reasons.append(Reason(name, f"{value} is negative and not -1 (unlimited)"))
    memory = r.memory_limit_in_bytes
    swap = r.memory_swap_limit_in_bytes
    if swap > 0 and memory > 0 and swap < memory:
        # runc: memory+swap must be at least memory.
        reasons.append(Reason("memory_swap_limit_in_bytes", f"{swap} is below memory_limit_in_bytes {memory}"))
    return reasons


def _set_reasons(name: str, text: str, allowed: frozenset[int], what: str) -> list[Reason]:
    if not text:
        return []
    try:
        ids = parse_id_list(text)
    except ValueError as exc:
        return [Reason(name, f"{text[:64]!r} is not a list of ids: {exc}")]
    missing = sorted(ids - allowed)
    if missing:
        return [Reason(name, f"{text[:64]!r} names {what} ({_first_ids(missing)})")]
    return []


def _first_ids(ids: list[int]) -> str:
    """The first eight of sorted ``ids`` a reason names, then "..." for more."""
    return ",".join(map(str, ids[:8])) + (",..." if len(ids) > 8 else "")
