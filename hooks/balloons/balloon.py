"""A balloon and a container in it: plain data, with the sizing rules both
follow (a balloon's target size from its members' requests, a request from
the CRI cpu_shares). The pool (:mod:`.pool`) decides which CPUs and members
each balloon has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .config import BalloonType


ContainerKey = tuple[str, str]  # (pod uid, container name)


@dataclass
class Member:
    key: ContainerKey
    namespace: str
    pod_name: str
    milli: int
    container_id: str = ""

    @property
    def pod_uid(self) -> str:
        return self.key[0]

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.pod_name}/{self.key[1]}"


@dataclass
class Balloon:
    btype: BalloonType
    index: int
    cpus: frozenset[int]
    members: dict[ContainerKey, Member] = field(default_factory=dict)
    fixed: bool = False  # the reserved balloon: its CPUs never change

    @property
    def name(self) -> str:
        return f"{self.btype.name}[{self.index}]"

    @property
    def requested_milli(self) -> int:
        return sum(m.milli for m in self.members.values())

    def target_size(self, extra_milli: int = 0, joining: bool = False) -> int:
        """CPUs for its members' requests (``joining``: and one more member's,
        ``extra_milli``). A balloon with members has at least one CPU, even if
        they request none (BestEffort), as in NRI's balloons: with none they
        would run on the reserved CPUs."""
        requested = self.requested_milli + extra_milli
        if self.members or joining:
            requested = max(requested, 1)
        size = max(math.ceil(requested / 1000), self.btype.min_cpus)
        return min(size, self.btype.max_cpus) if self.btype.max_cpus else size

    def fits(self, milli: int) -> bool:
        """Within maxCPUs with ``milli`` more."""
        if self.fixed or not self.btype.max_cpus:
            return True
        return math.ceil((self.requested_milli + milli) / 1000) <= self.btype.max_cpus

    def has_pod(self, pod_uid: str) -> bool:
        return any(m.pod_uid == pod_uid for m in self.members.values())


def cpus_for(milli: int) -> int:
    """A new balloon's CPUs for its first member: at least one (see target_size)."""
    return max(math.ceil(milli / 1000), 1)


def milli_from_shares(shares: int) -> int:
    """The CPU request behind a CRI cpu_shares value (kubelet: shares = milli*1024/1000, at least 2).
    2 (kubelet's minimum, a BestEffort container) and unset count as no request."""
    if shares <= 2:
        return 0
    return math.ceil(shares * 1000 / 1024)
