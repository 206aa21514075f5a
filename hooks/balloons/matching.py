"""What a balloon type matches a container by: the pod and container a
hook request describes, and the NRI balloons policy's matchExpressions on
them (their checks as config keys: config.py).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field

OPERATORS = {
    "Equals", "NotEqual", "In", "NotIn", "Exists", "NotExist", "AlwaysTrue",
    "Matches", "MatchesNot", "MatchesAny", "MatchesNone",
}


@dataclass(frozen=True)
class PodContext:
    """What placement decisions look at, from a hook request."""

    namespace: str
    pod_name: str
    container_name: str
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    pod_annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MatchExpression:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def _value(self, pod: PodContext) -> str | None:
        key = self.key
        if key in ("pod/namespace", "namespace"):
            return pod.namespace
        if key == "pod/name":
            return pod.pod_name
        if key == "name":
            return pod.container_name
        label = key.removeprefix("pod/").removeprefix("labels/")
        return pod.pod_labels.get(label)

    def matches(self, pod: PodContext) -> bool:
        value, op, values = self._value(pod), self.operator, self.values
        if op == "AlwaysTrue":
            return True
        if op == "Exists":
            return value is not None
        if op == "NotExist":
            return value is None
        if op == "Equals":
            return value == values[0]
        if op == "NotEqual":
            return value != values[0]
        if op == "In":
            return value in values
        if op == "NotIn":
            return value not in values
        glob = value is not None and any(fnmatch.fnmatchcase(value, pattern) for pattern in values)
        if op in ("Matches", "MatchesAny"):
            return glob
        return not glob  # MatchesNot, MatchesNone
