"""runtimeproxy.cripath.methods: CRI versions, method paths and the method table."""

from __future__ import annotations

import pytest

from cri_api.v1 import api_pb2 as v1_pb2
from cri_api.v1alpha2 import api_pb2 as v1alpha2_pb2
from runtimeproxy.cripath import methods
from runtimeproxy.cripath.methods import (
    METHODS,
    V1,
    V1_ONLY_METHODS,
    V1ALPHA2,
    ApiVersion,
    MethodRef,
    parse_method,
)

from .schemas import COMMON_METHOD_PATHS


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/runtime.v1.RuntimeService/Version", MethodRef(V1, "RuntimeService", "Version")),
        ("/runtime.v1alpha2.ImageService/PullImage", MethodRef(V1ALPHA2, "ImageService", "PullImage")),
        # a method newer than our protos is still a CRI method
        ("/runtime.v1.RuntimeService/FutureThing", MethodRef(V1, "RuntimeService", "FutureThing")),
    ],
)
def test_parse_method_valid(path: str, expected: MethodRef) -> None:
    ref = parse_method(path)
    assert ref == expected
    assert ref is not None and ref.path == path


@pytest.mark.parametrize(
    "path",
    [
        "/grpc.health.v1.Health/Check",
        "/runtime.v1.FooService/Version",
        "/runtime.v2.RuntimeService/Version",
        "/RuntimeService/Version",
        "runtime.v1.RuntimeService/Version",
        "/runtime.v1.RuntimeService/",
        "/runtime.v1.RuntimeService",
        "/runtime.v1.RuntimeService/Version/x",
        "",
        "/",
    ],
)
def test_parse_method_invalid(path: str) -> None:
    assert parse_method(path) is None


def test_method_ref_in_version() -> None:
    ref = parse_method("/runtime.v1alpha2.RuntimeService/CreateContainer")
    assert ref is not None
    assert ref.in_version(V1).path == "/runtime.v1.RuntimeService/CreateContainer"
    assert ref.in_version(V1).in_version(V1ALPHA2) == ref
    assert ref.qualified_name == "RuntimeService/CreateContainer"


def test_versions() -> None:
    assert V1 == "v1" and V1ALPHA2 == "v1alpha2"
    assert [v.package for v in ApiVersion] == ["runtime.v1", "runtime.v1alpha2"]


def test_methods_table() -> None:
    for version, table in METHODS.items():
        for path, info in table.items():
            ref = parse_method(path)
            assert ref is not None and ref.version == version
            assert (ref.service, ref.method) == (info.service, info.name)
    info = METHODS[V1]["/runtime.v1.RuntimeService/CreateContainer"]
    assert (info.request, info.response) == (v1_pb2.CreateContainerRequest, v1_pb2.CreateContainerResponse)
    assert not info.server_streaming and not info.client_streaming
    assert METHODS[V1]["/runtime.v1.RuntimeService/GetContainerEvents"].server_streaming
    assert METHODS[V1ALPHA2]["/runtime.v1alpha2.ImageService/PullImage"].request is v1alpha2_pb2.PullImageRequest
    assert len(METHODS[V1ALPHA2]) == len(COMMON_METHOD_PATHS)


def test_v1_only_methods() -> None:
    v1_names = {f"{i.service}/{i.name}" for i in METHODS[V1].values()}
    v1alpha2_names = {f"{i.service}/{i.name}" for i in METHODS[V1ALPHA2].values()}
    assert V1_ONLY_METHODS == v1_names - v1alpha2_names
    assert {"RuntimeService/CheckpointContainer", "RuntimeService/GetContainerEvents"} <= V1_ONLY_METHODS
    assert "RuntimeService/CreateContainer" not in V1_ONLY_METHODS


def test_module_tables_are_immutable() -> None:
    with pytest.raises(TypeError):
        METHODS[V1]["/x"] = METHODS[V1]["/runtime.v1.RuntimeService/Version"]  # type: ignore[index]
    assert isinstance(methods.V1_ONLY_METHODS, frozenset)
