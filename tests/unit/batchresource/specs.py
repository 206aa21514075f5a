"""Annotation builders for the batchresource tests."""

from __future__ import annotations

import json

from hooks.batchresource.spec import ANNOTATION_SPEC, BATCH_CPU, BATCH_MEMORY, LABEL_QOS

BE = {LABEL_QOS: "BE"}


def batch(cpu: str | None = None, memory: str | None = None) -> dict[str, str]:
    out = {}
    if cpu is not None:
        out[BATCH_CPU] = cpu
    if memory is not None:
        out[BATCH_MEMORY] = memory
    return out


def container(request_cpu=None, request_memory=None, limit_cpu=None, limit_memory=None) -> dict:
    return {"requests": batch(request_cpu, request_memory), "limits": batch(limit_cpu, limit_memory)}


def annotation(containers: dict, init: dict | None = None) -> dict[str, str]:
    doc: dict = {"containers": containers}
    if init is not None:
        doc["initContainers"] = init
    return {ANNOTATION_SPEC: json.dumps(doc)}
