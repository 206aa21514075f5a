"""Which pods the hook handles, and their batch-resource spec from the pod annotation."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .quantity import QuantityError, quantity_value

__all__ = [
    "ANNOTATION_SPEC",
    "BATCH_CPU",
    "BATCH_MEMORY",
    "LABEL_QOS",
    "MAX_MEMORY_BYTES",
    "MAX_MILLI_CPU",
    "ContainerBatch",
    "PodBatchSpec",
    "SpecError",
    "is_be_pod",
    "parse_spec",
    "pod_spec",
]

LABEL_QOS = "koordinator.sh/qosClass"
ANNOTATION_SPEC = "node.koordinator.sh/extended-resource-spec"
BATCH_CPU = "kubernetes.io/batch-cpu"  # milli-cores
BATCH_MEMORY = "kubernetes.io/batch-memory"  # bytes

# Larger values are a typo or an attack, not a node: refuse them rather than
# write a nonsense quota (and overflow int64 in quota = milli * 100).
MAX_MILLI_CPU = 1_000_000 * 1000  # a million cores
MAX_MEMORY_BYTES = 2**60  # 1 EiB


class SpecError(ValueError):
    """The pod's extended-resource-spec cannot be used; the message says why."""


@dataclass(frozen=True)
class ContainerBatch:
    """One container's batch resources; None where the spec does not set it."""

    cpu_request: int | None = None  # milli-cores
    cpu_limit: int | None = None
    memory_request: int | None = None  # bytes
    memory_limit: int | None = None


@dataclass(frozen=True)
class PodBatchSpec:
    """``containers`` by name; ``init_containers`` only when the spec names them apart."""

    containers: Mapping[str, ContainerBatch]
    init_containers: Mapping[str, ContainerBatch] = field(default_factory=lambda: MappingProxyType({}))

    def has(self, name: str) -> bool:
        return name in self.containers or name in self.init_containers

    def container(self, name: str) -> ContainerBatch:
        if name in self.containers:
            return self.containers[name]
        if name in self.init_containers:
            return self.init_containers[name]
        raise SpecError(f"container {name!r} is not in {ANNOTATION_SPEC}")


def is_be_pod(labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
    """QoS class BE, by label or (as Koordinator also accepts) by annotation."""
    return labels.get(LABEL_QOS) == "BE" or (LABEL_QOS not in labels and annotations.get(LABEL_QOS) == "BE")


def _amount(value: object, where: str, maximum: int) -> int:
    try:
        amount = quantity_value(value)
    except QuantityError as exc:
        raise SpecError(f"{where}: {exc}") from None
    if amount < 0:
        raise SpecError(f"{where}: {value!r} is negative")
    if amount > maximum:
        raise SpecError(f"{where}: {value!r} is absurdly large (more than {maximum})")
    return amount


def _container(name: str, raw: object) -> ContainerBatch:
    if not isinstance(raw, dict):
        raise SpecError(f"container {name!r}: expected an object, got {type(raw).__name__}")
    values: dict[str, int | None] = {}
    for kind in ("requests", "limits"):
        part = raw.get(kind) or {}
        if not isinstance(part, dict):
            raise SpecError(f"container {name!r}: {kind} must be an object")
        where = f"container {name!r} {kind}"
        cpu, memory = part.get(BATCH_CPU), part.get(BATCH_MEMORY)
        values[f"cpu_{kind[:-1]}"] = None if cpu is None else _amount(cpu, f"{where} {BATCH_CPU}", MAX_MILLI_CPU)
        values[f"memory_{kind[:-1]}"] = None if memory is None else _amount(memory, f"{where} {BATCH_MEMORY}", MAX_MEMORY_BYTES)
    return ContainerBatch(**values)


def _containers(raw: object, key: str) -> Mapping[str, ContainerBatch]:
    if raw is None:
        return MappingProxyType({})
    if not isinstance(raw, dict):
        raise SpecError(f"{key!r} must be an object of containers")
    return MappingProxyType({str(name): _container(str(name), spec) for name, spec in raw.items()})


def parse_spec(text: str) -> PodBatchSpec:
    """Parse the annotation's JSON; :class:`SpecError` for anything unusable."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: a JSON number past Python's 4300 digits
        raise SpecError(f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise SpecError("expected a JSON object")
    containers = _containers(doc.get("containers"), "containers")
    # Not in Koordinator's spec: an optional way to name init containers apart,
    # so the pod total can follow Kubernetes' effective-request rule.
    init = _containers(doc.get("initContainers"), "initContainers")
    both = set(containers) & set(init)
    if both:
        raise SpecError(f"containers {sorted(both)} are listed both as containers and as initContainers")
    return PodBatchSpec(containers, init)


def pod_spec(labels: Mapping[str, str], annotations: Mapping[str, str]) -> PodBatchSpec | None:
    """The spec of a BE pod that carries one; None for every pod the hook leaves alone.

    Raises :class:`SpecError` for a BE pod whose annotation is malformed."""
    if not is_be_pod(labels, annotations) or ANNOTATION_SPEC not in annotations:
        return None
    return parse_spec(annotations[ANNOTATION_SPEC])
