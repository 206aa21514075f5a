"""The two CRI schema copies are wire-compatible: v1 only adds to v1alpha2.

Generated from the descriptors of both schema copies, so a future copy that
breaks v1alpha2 <-> v1 wire compatibility fails them without anyone updating
a list. This is what lets the proxy translate a call by rewriting its path.
"""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

from cri_api.v1 import api_pb2 as v1_pb2
from cri_api.v1alpha2 import api_pb2 as v1alpha2_pb2
from runtimeproxy.cripath.schemadiff import relative_name, v1_only_fields

from .convert import to_v1, to_v1alpha2
from .schemas import (
    COMMON_MESSAGES,
    V1_FILE,
    V1ALPHA2_FILE,
    all_enums,
    common_enum_value,
    create_request_with_binary_env,
    fill,
    is_map,
    serialized,
    v1_common_only,
)

# --------------------------------------------------------------------------- schema compatibility


def test_common_message_count() -> None:
    # Every v1alpha2 message has a v1 twin; 122 in cri-api v0.25.16.
    assert len(COMMON_MESSAGES) == len(V1ALPHA2_FILE.message_types_by_name) == 122


def assert_fields_compatible(old: FieldDescriptor, new: FieldDescriptor | None, where: str) -> None:
    assert new is not None, f"{where}: v1alpha2 field {old.name}={old.number} missing in v1"
    assert new.is_repeated == old.is_repeated, f"{where}: cardinality differs"
    assert is_map(new) == is_map(old), f"{where}: map-ness differs"
    if new.type != old.type:
        # The only allowed change: KeyValue.value string -> bytes (both length-delimited).
        assert (where, {old.type, new.type}) == (
            "KeyValue.value",
            {FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES},
        ), f"{where}: type {old.type} -> {new.type}"
    if is_map(old):
        for part in ("key", "value"):
            assert_fields_compatible(
                old.message_type.fields_by_name[part],
                new.message_type.fields_by_name[part],
                f"{where}[{part}]",
            )
    elif old.message_type is not None:
        assert relative_name(new.message_type) == relative_name(old.message_type), f"{where}: message type"
    elif old.enum_type is not None:
        assert relative_name(new.enum_type) == relative_name(old.enum_type), f"{where}: enum type"


@pytest.mark.parametrize("name", COMMON_MESSAGES)
def test_v1alpha2_fields_exist_in_v1(name: str) -> None:
    old = V1ALPHA2_FILE.message_types_by_name[name]
    new = V1_FILE.message_types_by_name[name]
    for field in old.fields:
        assert_fields_compatible(field, new.fields_by_number.get(field.number), f"{name}.{field.name}")


def test_v1alpha2_enum_values_exist_in_v1() -> None:
    new_enums, old_enums = all_enums(V1_FILE), all_enums(V1ALPHA2_FILE)
    assert set(old_enums) <= set(new_enums)
    for name, old in old_enums.items():
        new = new_enums[name]
        for value in old.values:
            assert new.values_by_number[value.number].name == value.name, f"{name}.{value.name}"


def test_v1alpha2_rpcs_exist_in_v1() -> None:
    for service in V1ALPHA2_FILE.services_by_name.values():
        v1_service = V1_FILE.services_by_name[service.name]
        for old in service.methods:
            new = v1_service.methods_by_name.get(old.name)
            assert new is not None, f"{service.name}/{old.name}"
            assert relative_name(new.input_type) == relative_name(old.input_type)
            assert relative_name(new.output_type) == relative_name(old.output_type)
            assert (new.server_streaming, new.client_streaming) == (old.server_streaming, old.client_streaming)


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", COMMON_MESSAGES)
def test_round_trip_from_v1alpha2(name: str) -> None:
    original = fill(getattr(v1alpha2_pb2, name)())
    as_v1 = to_v1(original)
    assert as_v1.DESCRIPTOR.full_name == f"runtime.v1.{name}"
    assert serialized(as_v1) == serialized(original)  # same bytes on the wire
    back = to_v1alpha2(as_v1)
    assert back == original
    assert serialized(back) == serialized(original)


@pytest.mark.parametrize("name", COMMON_MESSAGES)
def test_round_trip_from_v1_common_fields(name: str) -> None:
    original = fill(getattr(v1_pb2, name)(), v1_common_only, common_enum_value)
    assert v1_only_fields(original) == []
    as_v1alpha2 = to_v1alpha2(original)
    assert as_v1alpha2.DESCRIPTOR.full_name == f"runtime.v1alpha2.{name}"
    assert serialized(as_v1alpha2) == serialized(original)
    assert serialized(to_v1(as_v1alpha2)) == serialized(original)


@pytest.mark.parametrize("name", COMMON_MESSAGES)
def test_v1_only_fields_survive_v1alpha2_as_unknown_fields(name: str) -> None:
    original = fill(getattr(v1_pb2, name)())
    back = to_v1(to_v1alpha2(original))
    assert back == original
    assert serialized(back) == serialized(original)


def test_convert_is_identity_within_a_version_and_rejects_others() -> None:
    msg = v1_pb2.VersionRequest(version="x")
    assert to_v1(msg) is msg
    with pytest.raises(ValueError, match="no twin"):
        to_v1alpha2(v1_pb2.CheckpointContainerRequest(container_id="c"))


# --------------------------------------------------------------------------- invalid UTF-8


def test_binary_env_value_cannot_become_a_v1alpha2_object() -> None:
    # Finding (protobuf upb): parsing invalid UTF-8 into a proto3 string field
    # raises. KeyValue.value is bytes in v1 but string in v1alpha2, hence the
    # proxy forwards bytes and never parses them as v1alpha2 objects.
    request = create_request_with_binary_env()
    with pytest.raises(DecodeError, match="UTF-8"):
        to_v1alpha2(request)
    with pytest.raises(DecodeError):
        v1alpha2_pb2.CreateContainerRequest.FromString(request.SerializeToString())
