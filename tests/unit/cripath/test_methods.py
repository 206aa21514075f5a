"""Tests for runtimeproxy.convert.

The compatibility tests are generated from the descriptors of both schema
copies, so a future copy that breaks v1alpha2 <-> v1 wire compatibility fails
them without anyone updating a list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, text_format
from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    FileDescriptor,
)
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from cri_api.v1 import api_pb2 as v1_pb2
from cri_api.v1alpha2 import api_pb2 as v1alpha2_pb2
from runtimeproxy.cripath import methods as convert
from runtimeproxy.cripath.methods import (
    METHODS,
    V1,
    V1_ONLY_METHODS,
    V1ALPHA2,
    ApiVersion,
    MethodRef,
    SchemaDiff,
    may_carry_v1_only,
    parse_method,
    request_needs_check,
    to_v1,
    to_v1alpha2,
    unknown_to_schema,
    v1_only_fields,
)

V1_FILE: FileDescriptor = v1_pb2.DESCRIPTOR
V1ALPHA2_FILE: FileDescriptor = v1alpha2_pb2.DESCRIPTOR
COMMON_MESSAGES = sorted(set(V1_FILE.message_types_by_name) & set(V1ALPHA2_FILE.message_types_by_name))
COMMON_METHOD_PATHS = sorted(
    path for path in METHODS[V1] if path.replace("runtime.v1.", "runtime.v1alpha2.", 1) in METHODS[V1ALPHA2]
)


def relative_name(desc: Descriptor | EnumDescriptor) -> str:
    return desc.full_name.removeprefix(desc.file.package + ".")


def twin(desc: Descriptor, file: FileDescriptor) -> Descriptor | None:
    """The message of the same relative name in ``file``."""
    try:
        return file.pool.FindMessageTypeByName(f"{file.package}.{relative_name(desc)}")
    except KeyError:
        return None


def is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


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


def all_enums(file: FileDescriptor) -> dict[str, EnumDescriptor]:
    enums = {relative_name(e): e for e in file.enum_types_by_name.values()}
    for desc in file.message_types_by_name.values():
        enums.update({relative_name(e): e for e in desc.enum_types})
    return enums


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


# --------------------------------------------------------------------------- generic filler

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
    for field in msg.DESCRIPTOR.fields:
        if not include(msg.DESCRIPTOR, field):
            continue
        value = getattr(msg, field.name)
        if is_map(field):
            key_field, value_field = field.message_type.fields
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


@pytest.mark.parametrize("name", COMMON_MESSAGES)
def test_may_carry_v1_only_agrees_with_a_fully_filled_message(name: str) -> None:
    # Independent check of the precomputed table: filling every v1 field finds
    # v1-only fields exactly when the type is said to be able to carry them.
    cls = getattr(v1_pb2, name)
    assert bool(v1_only_fields(fill(cls()))) == may_carry_v1_only(cls.DESCRIPTOR)


def test_convert_is_identity_within_a_version_and_rejects_others() -> None:
    msg = v1_pb2.VersionRequest(version="x")
    assert to_v1(msg) is msg
    with pytest.raises(ValueError, match="no twin"):
        to_v1alpha2(v1_pb2.CheckpointContainerRequest(container_id="c"))


# --------------------------------------------------------------------------- invalid UTF-8


def create_request_with_binary_env() -> Message:
    return v1_pb2.CreateContainerRequest(
        pod_sandbox_id="p",
        config=v1_pb2.ContainerConfig(envs=[v1_pb2.KeyValue(key="K", value=b"\xff\xfe")]),
    )


def test_binary_env_value_cannot_become_a_v1alpha2_object() -> None:
    # Finding (protobuf upb): parsing invalid UTF-8 into a proto3 string field
    # raises. KeyValue.value is bytes in v1 but string in v1alpha2, hence the
    # proxy forwards bytes and never parses them as v1alpha2 objects.
    request = create_request_with_binary_env()
    with pytest.raises(DecodeError, match="UTF-8"):
        to_v1alpha2(request)
    with pytest.raises(DecodeError):
        v1alpha2_pb2.CreateContainerRequest.FromString(request.SerializeToString())


def test_binary_env_value_survives_the_proxy_path() -> None:
    # What the proxy does: the bytes are the same in both versions; it parses
    # them as v1 only (whichever version the peer speaks) and forwards bytes.
    request = create_request_with_binary_env()
    wire = request.SerializeToString()
    ref = parse_method("/runtime.v1alpha2.RuntimeService/CreateContainer")
    assert ref is not None
    info = METHODS[V1][ref.in_version(V1).path]
    parsed = info.request.FromString(wire)
    assert parsed.config.envs[0].value == b"\xff\xfe"
    assert parsed.SerializeToString() == wire
    assert v1_only_fields(parsed) == []


# --------------------------------------------------------------------------- v1-only fields


def test_v1_only_fields_of_create_container() -> None:
    request = v1_pb2.CreateContainerRequest(
        pod_sandbox_id="p",
        config=v1_pb2.ContainerConfig(
            metadata=v1_pb2.ContainerMetadata(name="c"),
            image=v1_pb2.ImageSpec(image="busybox", user_specified_image="busybox:latest"),
            envs=[v1_pb2.KeyValue(key="K", value=b"\xff")],
            mounts=[
                v1_pb2.Mount(container_path="/a", host_path="/b"),
                v1_pb2.Mount(container_path="/c", recursive_read_only=True, readonly=True),
            ],
            linux=v1_pb2.LinuxContainerConfig(
                security_context=v1_pb2.LinuxContainerSecurityContext(
                    run_as_group=v1_pb2.Int64Value(value=5),  # exists in v1alpha2 too
                    supplemental_groups_policy=v1_pb2.Strict,
                    namespace_options=v1_pb2.NamespaceOption(network=v1_pb2.NODE),
                )
            ),
            CDI_devices=[v1_pb2.CDIDevice(name="vendor.com/gpu=0")],
            stop_signal=v1_pb2.SIGTERM,
        ),
        sandbox_config=v1_pb2.PodSandboxConfig(
            labels={"app": "x"},
            windows=v1_pb2.WindowsPodSandboxConfig(
                security_context=v1_pb2.WindowsSandboxSecurityContext(
                    namespace_options=v1_pb2.WindowsNamespaceOption(network=v1_pb2.NODE),
                )
            ),
        ),
    )
    assert v1_only_fields(request) == [
        "config.image.user_specified_image",
        "config.mounts[1].recursive_read_only",
        "config.linux.security_context.supplemental_groups_policy",
        "config.CDI_devices",
        "config.stop_signal",
        # a v1-only message type is reported at its field, not looked into
        "sandbox_config.windows.security_context.namespace_options",
    ]


def test_v1_only_fields_of_common_request_is_empty() -> None:
    request = v1_pb2.CreateContainerRequest(
        pod_sandbox_id="p",
        config=v1_pb2.ContainerConfig(
            image=v1_pb2.ImageSpec(image="busybox", annotations={"a": "b"}),
            mounts=[v1_pb2.Mount(container_path="/c", selinux_relabel=True)],
            linux=v1_pb2.LinuxContainerConfig(
                resources=v1_pb2.LinuxContainerResources(cpu_shares=2, unified={"memory.high": "1"}),
                security_context=v1_pb2.LinuxContainerSecurityContext(run_as_group=v1_pb2.Int64Value(value=5)),
            ),
        ),
    )
    assert v1_only_fields(request) == []


def test_v1_only_fields_of_update_container_resources() -> None:
    request = v1_pb2.UpdateContainerResourcesRequest(
        container_id="c",
        windows=v1_pb2.WindowsContainerResources(
            cpu_shares=1, affinity_cpus=[v1_pb2.WindowsCpuGroupAffinity(cpu_group=1)]
        ),
    )
    assert v1_only_fields(request) == ["windows.affinity_cpus"]


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field ``number`` (for numbers below 2048)."""
    tag = (number << 3) | 2
    head = bytes([tag & 0x7F | 0x80, tag >> 7]) if tag >= 0x80 else bytes([tag])
    return head + bytes([len(payload)]) + payload


def test_unknown_to_schema_finds_fields_and_enum_values_wherever_they_are() -> None:
    security = v1_pb2.LinuxContainerSecurityContext(privileged=True).SerializeToString() + _field(999, b"new")
    linux = v1_pb2.LinuxContainerConfig.FromString(_field(2, security))  # field 2: security_context
    request = v1_pb2.CreateContainerRequest(
        pod_sandbox_id="p", config=v1_pb2.ContainerConfig(linux=linux, annotations={"a": "b"})
    )
    request.config.mounts.add(container_path="/x")
    request.config.mounts.add(container_path="/y", propagation=7)  # no MountPropagation 7 (yet)
    raw = request.SerializeToString() + _field(999, b"top") + _field(999, b"again")
    assert unknown_to_schema(v1_pb2.CreateContainerRequest.FromString(raw)) == [
        "#999",
        "config.mounts[1].propagation=7",
        "config.linux.security_context.#999",
    ]


def test_unknown_to_schema_is_empty_when_all_is_known() -> None:
    request = v1_pb2.CreateContainerRequest(
        config=v1_pb2.ContainerConfig(annotations={"a": "b"}, envs=[v1_pb2.KeyValue(key="K", value=b"\xff")]),
        sandbox_config=v1_pb2.PodSandboxConfig(labels={"l": "v"}),
    )
    request.config.mounts.add(container_path="/x", propagation=v1_pb2.PROPAGATION_BIDIRECTIONAL)
    assert unknown_to_schema(v1_pb2.CreateContainerRequest.FromString(request.SerializeToString())) == []
    resources = v1_pb2.LinuxContainerResources.FromString(
        v1_pb2.LinuxContainerResources(cpu_quota=1, unified={"k": "v"}).SerializeToString() + _field(999, b"x")
    )
    assert unknown_to_schema(v1_pb2.UpdateContainerResourcesRequest(linux=resources)) == ["linux.#999"]


def test_request_needs_check() -> None:
    for method in ("CreateContainer", "RunPodSandbox", "UpdateContainerResources", "PullImage"):
        assert request_needs_check(method), method
    for method in ("Version", "ListContainers", "StopContainer", "ExecSync", "NoSuchMethod"):
        assert not request_needs_check(method), method


@pytest.mark.parametrize("path", COMMON_METHOD_PATHS)
def test_request_needs_check_agrees_with_a_fully_filled_request(path: str) -> None:
    info = METHODS[V1][path]
    assert request_needs_check(info.name) == bool(v1_only_fields(fill(info.request())))


# --------------------------------------------------------------------------- synthetic schema

NEW_SCHEMA = """
name: "synth_new.proto" package: "synth.new" syntax: "proto3"
enum_type { name: "Mode" value { name: "A" number: 0 } value { name: "B" number: 1 } value { name: "C" number: 2 } }
message_type {
  name: "Node"
  field { name: "name" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "child" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".synth.new.Node" }
  field { name: "mode" number: 3 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".synth.new.Mode" }
  field { name: "modes" number: 4 label: LABEL_REPEATED type: TYPE_ENUM type_name: ".synth.new.Mode" }
  field { name: "kids" number: 5 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".synth.new.Node.KidsEntry" }
  field { name: "extra" number: 6 label: LABEL_OPTIONAL type: TYPE_INT32 }
  field { name: "gadget" number: 7 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".synth.new.Gadget" }
  field { name: "retyped" number: 8 label: LABEL_OPTIONAL type: TYPE_INT64 }
  nested_type {
    name: "KidsEntry" options { map_entry: true }
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".synth.new.Node" }
  }
}
message_type { name: "Gadget" field { name: "x" number: 1 label: LABEL_OPTIONAL type: TYPE_INT32 } }
message_type { name: "Plain" field { name: "s" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING } }
"""

OLD_SCHEMA = """
name: "synth_old.proto" package: "synth.old" syntax: "proto3"
enum_type { name: "Mode" value { name: "A" number: 0 } value { name: "B" number: 1 } }
message_type {
  name: "Node"
  field { name: "name" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "child" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".synth.old.Node" }
  field { name: "mode" number: 3 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".synth.old.Mode" }
  field { name: "modes" number: 4 label: LABEL_REPEATED type: TYPE_ENUM type_name: ".synth.old.Mode" }
  field { name: "kids" number: 5 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".synth.old.Node.KidsEntry" }
  field { name: "retyped" number: 8 label: LABEL_OPTIONAL type: TYPE_STRING }
  nested_type {
    name: "KidsEntry" options { map_entry: true }
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".synth.old.Node" }
  }
}
message_type { name: "Plain" field { name: "s" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING } }
"""


def synthetic_files() -> Iterator[FileDescriptor]:
    pool = descriptor_pool.DescriptorPool()
    for text in (NEW_SCHEMA, OLD_SCHEMA):
        proto = text_format.Parse(text, descriptor_pb2.FileDescriptorProto())
        pool.Add(proto)
        yield pool.FindFileByName(proto.name)


def test_schema_diff_on_a_recursive_schema_with_new_enum_values() -> None:
    new, old = synthetic_files()
    diff = SchemaDiff(new, old)
    node_cls = GetMessageClass(new.message_types_by_name["Node"])
    assert diff.may_carry_new(new.message_types_by_name["Node"])
    assert not diff.may_carry_new(new.message_types_by_name["Plain"])

    node = node_cls(name="n", mode=2, modes=[1, 2], extra=1, retyped=3)
    node.child.child.extra = 1
    node.child.child.mode = 1  # exists in old
    node.kids["k"].extra = 1
    node.kids["j"].name = "only common"
    node.gadget.SetInParent()
    assert diff.new_fields(node) == [
        "child.child.extra",
        "mode=C",
        "modes[1]=C",
        "kids['k'].extra",
        "extra",
        "gadget",
        "retyped",  # same number, incompatible type
    ]
    assert diff.new_fields(node_cls(name="n", modes=[0, 1])) == []


# --------------------------------------------------------------------------- methods


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
    for version, methods in METHODS.items():
        for path, info in methods.items():
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
    assert isinstance(convert.V1_ONLY_METHODS, frozenset)
