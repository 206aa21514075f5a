import json

import pytest

from hooks.batchresource.spec import (
    ANNOTATION_SPEC,
    LABEL_QOS,
    MAX_MEMORY_BYTES,
    MAX_MILLI_CPU,
    ContainerBatch,
    SpecError,
    is_be_pod,
    parse_spec,
    pod_spec,
)

from .specs import BE, annotation, container


@pytest.mark.parametrize(
    ("labels", "annotations", "be"),
    [
        (BE, {}, True),
        ({}, BE, True),  # the same key as an annotation
        ({LABEL_QOS: "LS"}, {}, False),
        ({LABEL_QOS: "LS"}, BE, False),  # the label wins
        ({LABEL_QOS: "be"}, {}, False),  # case matters, as in Koordinator
        ({}, {}, False),
    ],
)
def test_be_pod(labels, annotations, be) -> None:
    assert is_be_pod(labels, annotations) is be


def test_pods_left_alone() -> None:
    spec = annotation({"main": container("500", "128Mi", "500", "128Mi")})
    assert pod_spec({LABEL_QOS: "LS"}, spec) is None  # not BE
    assert pod_spec(BE, {}) is None  # BE without the spec
    assert pod_spec(BE, spec) is not None


def test_parse_requests_and_limits() -> None:
    spec = parse_spec(annotation({"main": container("500", "128Mi", "1k", "1Gi")})[ANNOTATION_SPEC])
    assert spec.container("main") == ContainerBatch(cpu_request=500, cpu_limit=1000, memory_request=128 * 2**20, memory_limit=2**30)


def test_missing_parts_are_none() -> None:
    spec = parse_spec(json.dumps({"containers": {"a": {}, "b": {"requests": {"kubernetes.io/batch-cpu": "2"}}}}))
    assert spec.container("a") == ContainerBatch()
    assert spec.container("b") == ContainerBatch(cpu_request=2)


def test_init_containers_are_found_by_name() -> None:
    spec = parse_spec(annotation({"main": container("1")}, init={"setup": container("2")})[ANNOTATION_SPEC])
    assert spec.container("setup").cpu_request == 2
    assert set(spec.init_containers) == {"setup"}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"containers": []}', "must be an object"),
        ('{"containers": {"a": 5}}', "expected an object"),
        ('{"containers": {"a": {"limits": "1"}}}', "limits must be an object"),
        ('{"containers": {"a": {"limits": {"kubernetes.io/batch-cpu": "lots"}}}}', "is not a quantity"),
        ('{"containers": {"a": {"limits": {"kubernetes.io/batch-cpu": 500}}}}', "must be a string"),
        ('{"containers": {"a": {"requests": {"kubernetes.io/batch-memory": "-1Gi"}}}}', "negative"),
        ('{"containers": {"a": {"limits": {"kubernetes.io/batch-cpu": "2e9"}}}}', "absurdly large"),
        ('{"containers": {"a": {"limits": {"kubernetes.io/batch-memory": "2Ei"}}}}', "absurdly large"),
        ('{"containers": {"a": {}}, "initContainers": {"a": {}}}', "both as containers and as initContainers"),
    ],
)
def test_malformed(text: str, reason: str) -> None:
    with pytest.raises(SpecError, match=reason):
        parse_spec(text)


def test_limits_at_the_maximum_are_accepted() -> None:
    spec = parse_spec(json.dumps({"containers": {"a": {"limits": {
        "kubernetes.io/batch-cpu": str(MAX_MILLI_CPU), "kubernetes.io/batch-memory": str(MAX_MEMORY_BYTES)}}}}))
    assert spec.container("a") == ContainerBatch(cpu_limit=MAX_MILLI_CPU, memory_limit=MAX_MEMORY_BYTES)


def test_unknown_container() -> None:
    spec = parse_spec(annotation({"main": container("1")})[ANNOTATION_SPEC])
    with pytest.raises(SpecError, match="'sidecar' is not in"):
        spec.container("sidecar")


def test_malformed_be_pod_raises_for_the_caller_to_log() -> None:
    with pytest.raises(SpecError):
        pod_spec(BE, {ANNOTATION_SPEC: "{"})
