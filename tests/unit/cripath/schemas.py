"""Descriptors of both CRI schema copies and a generic message filler, for the schema tests."""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    FileDescriptor,
)
from google.protobuf.message import Message

from cri_api.v1 import api_pb2 as v1_pb2
from cri_api.v1alpha2 import api_pb2 as v1alpha2_pb2
from runtimeproxy.cripath.methods import METHODS, V1, V1ALPHA2
from runtimeproxy.cripath.schemadiff import relative_name

V1_FILE: FileDescriptor = v1_pb2.DESCRIPTOR
V1ALPHA2_FILE: FileDescriptor = v1alpha2_pb2.DESCRIPTOR
COMMON_MESSAGES = sorted(set(V1_FILE.message_types_by_name) & set(V1ALPHA2_FILE.message_types_by_name))
COMMON_METHOD_PATHS = sorted(
    path for path in METHODS[V1] if path.replace("runtime.v1.", "runtime.v1alpha2.", 1) in METHODS[V1ALPHA2]
)


def twin(desc: Descriptor, file: FileDescriptor) -> Descriptor | None:
    """The message of the same relative name in ``file``."""
    try:
        return file.pool.FindMessageTypeByName(f"{file.package}.{relative_name(desc)}")
    except KeyError:
        return None


def descriptor_of(msg: Message) -> Descriptor:
    """``msg.DESCRIPTOR``, typed as the Descriptor it is: types-protobuf types it as
    that or upb's own, which at run time is an instance of it (its metaclass says so)."""
    desc = msg.DESCRIPTOR
    assert isinstance(desc, Descriptor), desc
    return desc


def map_entry(field: FieldDescriptor) -> Descriptor | None:
    """The entry message of a map field; None for any other field."""
    entry = field.message_type
    return entry if entry is not None and entry.GetOptions().map_entry else None


def is_map(field: FieldDescriptor) -> bool:
    return map_entry(field) is not None


def all_enums(file: FileDescriptor) -> dict[str, EnumDescriptor]:
    enums = {relative_name(e): e for e in file.enum_types_by_name.values()}
    for desc in file.message_types_by_name.values():
        enums.update({relative_name(e): e for e in desc.enum_types})
    return enums


MAX_DEPTH = 12  # CRI has no recursive messages; this only guards against future ones


def scalar(field: FieldDescriptor, pick_enum: Callable[[EnumDescriptor], int]) -> object:
    """A deterministic non-default value for a scalar or enum field."""
    n = field.number
    match field.type:
        case FieldDescriptor.TYPE_BOOL:
            return True
        case FieldDescriptor.TYPE_STRING:
            return f"s{n}"
        case FieldDescriptor.TYPE_BYTES:
            return f"b{n}".encode()  # ASCII: valid as a v1alpha2 string too
        case FieldDescriptor.TYPE_FLOAT | FieldDescriptor.TYPE_DOUBLE:
            return n + 0.5
        case FieldDescriptor.TYPE_ENUM:
            assert field.enum_type is not None  # an enum field's, always set
            return pick_enum(field.enum_type)
        case FieldDescriptor.TYPE_INT32 | FieldDescriptor.TYPE_INT64 | FieldDescriptor.TYPE_SINT32 | (
            FieldDescriptor.TYPE_SINT64
        ) | FieldDescriptor.TYPE_SFIXED32 | FieldDescriptor.TYPE_SFIXED64:
            return -n - 1  # negative: exercises 10-byte varints
        case _:
            return n + 1


def highest_value(enum: EnumDescriptor) -> int:
    return max(v.number for v in enum.values)


def fill(
    msg: Message,
    include: Callable[[Descriptor, FieldDescriptor], bool] = lambda _m, _f: True,
    pick_enum: Callable[[EnumDescriptor], int] = highest_value,
    depth: int = 0,
) -> Message:
    """Set every (included) field of ``msg`` to a non-default value, recursively."""
    desc = descriptor_of(msg)
    for field in desc.fields:
        if not include(desc, field):
            continue
        value = getattr(msg, field.name)
        if (entry := map_entry(field)) is not None:
            key_field, value_field = entry.fields
            key = scalar(key_field, pick_enum)
            if value_field.message_type is None:
                value[key] = scalar(value_field, pick_enum)
            elif depth < MAX_DEPTH:
                fill(value[key], include, pick_enum, depth + 1)
        elif field.message_type is not None:
            if depth >= MAX_DEPTH:
                continue
            if field.is_repeated:
                fill(value.add(), include, pick_enum, depth + 1)
            else:
                fill(value, include, pick_enum, depth + 1)
                value.SetInParent()  # present even if nothing inside was set
        elif field.is_repeated:
            value.extend([scalar(field, pick_enum)] * 2)
        else:
            setattr(msg, field.name, scalar(field, pick_enum))
    return msg


def v1_common_only(message: Descriptor, field: FieldDescriptor) -> bool:
    old = twin(message, V1ALPHA2_FILE)
    return old is not None and field.number in old.fields_by_number


def common_enum_value(enum: EnumDescriptor) -> int:
    old = all_enums(V1ALPHA2_FILE)[relative_name(enum)]
    return max(v.number for v in old.values)


def serialized(msg: Message) -> bytes:
    return msg.SerializeToString(deterministic=True)


def create_request_with_binary_env() -> Message:
    return v1_pb2.CreateContainerRequest(
        pod_sandbox_id="p",
        config=v1_pb2.ContainerConfig(envs=[v1_pb2.KeyValue(key="K", value=b"\xff\xfe")]),
    )
