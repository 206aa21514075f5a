"""runtimeproxy.cripath.schemadiff: what a v1 message carries that v1alpha2 or our schema lacks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, text_format
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.message_factory import GetMessageClass

from cri_api.v1 import api_pb2 as v1_pb2
from runtimeproxy.cripath.methods import METHODS, V1, parse_method
from runtimeproxy.cripath.schemadiff import (
    SchemaDiff,
    may_carry_v1_only,
    request_needs_check,
    unknown_to_schema,
    v1_only_fields,
)

from .schemas import (
    COMMON_MESSAGES,
    COMMON_METHOD_PATHS,
    create_request_with_binary_env,
    fill,
)


@pytest.mark.parametrize("name", COMMON_MESSAGES)
def test_may_carry_v1_only_agrees_with_a_fully_filled_message(name: str) -> None:
    # Independent check of the precomputed table: filling every v1 field finds
    # v1-only fields exactly when the type is said to be able to carry them.
    cls = getattr(v1_pb2, name)
    assert bool(v1_only_fields(fill(cls()))) == may_carry_v1_only(cls.DESCRIPTOR)


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


def test_the_walks_are_bounded_on_a_hostile_request() -> None:
    """They run on the event loop: millions of values are not each looked at
    (nor each named): unknown bytes are counted, the walk stops at its budget."""
    from cri_api.v1 import api_pb2 as v1
    from runtimeproxy.cripath import schemadiff

    unknown = v1.ListContainersRequest.FromString(b"\xb8\x3e\x00" * 1_000_000)  # field 999, a million times
    assert schemadiff.unknown_to_schema(unknown) == ["3000000 bytes of fields"]
    flagged = v1.CreateContainerRequest(config=v1.ContainerConfig(
        mounts=[v1.Mount(recursive_read_only=True)] * (schemadiff.MAX_VISITS * 2)))
    found = schemadiff.v1_only_fields(flagged)
    assert found[0] == "config.mounts[0].recursive_read_only" and len(found) <= schemadiff.MAX_FINDINGS
    plain = v1.CreateContainerRequest(config=v1.ContainerConfig(mounts=[v1.Mount(readonly=True)] * (schemadiff.MAX_VISITS * 2)))
    assert schemadiff.v1_only_fields(plain) == [schemadiff.TOO_MANY]  # refused: more than is checked
    assert schemadiff.unknown_to_schema(plain) == [schemadiff.TOO_MANY]  # (mounts hold an enum: not all looked at)
    # An advisory finding first (kubelet's user_specified_image) does not let the rest through unchecked.
    advised = v1.CreateContainerRequest(config=v1.ContainerConfig(
        image=v1.ImageSpec(user_specified_image="busybox"),
        mounts=[v1.Mount()] * schemadiff.MAX_VISITS + [v1.Mount(recursive_read_only=True)]))
    assert schemadiff.TOO_MANY in schemadiff.v1_only_fields(advised)


def test_a_legitimately_large_request_is_checked_whole_for_unknown_enum_values() -> None:
    """Thousands of env vars (service links) hold no enum: they are not walked,
    and an unknown enum value elsewhere is still found."""
    from cri_api.v1 import api_pb2 as v1
    from runtimeproxy.cripath import schemadiff

    request = v1.CreateContainerRequest(config=v1.ContainerConfig(
        envs=[v1.KeyValue(key=f"SVC_{i}", value=b"10.0.0.1") for i in range(30_000)],
        annotations={f"a{i}": "v" for i in range(30_000)}))
    request.config.linux.security_context.namespace_options.network = 99
    assert schemadiff.unknown_to_schema(request) == ["config.linux.security_context.namespace_options.network=99"]
