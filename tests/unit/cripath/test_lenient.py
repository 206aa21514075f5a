"""runtimeproxy.cripath.lenient: the v1 schema's twin with every string a bytes field,
which schemadiff reads exactly like v1 (so a non-UTF-8 string cannot skip the check)."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.cripath import lenient
from runtimeproxy.cripath.schemadiff import SchemaDiff, unknown_to_schema, v1_only_fields, walk_messages

from .schemas import V1_FILE, fill, serialized
from .test_schemadiff import _field, synthetic_files

PLACEHOLDER = "PLACEHOLDER"
NOT_UTF8 = b"\xff\xfe" + b"\x80" * (len(PLACEHOLDER) - 2)  # same length: the framing stays valid


def not_utf8(msg: Message) -> bytes:
    """``msg``'s bytes with every PLACEHOLDER string made invalid UTF-8."""
    raw = serialized(msg)
    assert PLACEHOLDER.encode() in raw
    return raw.replace(PLACEHOLDER.encode(), NOT_UTF8)


def create(**config: object) -> v1.CreateContainerRequest:
    return v1.CreateContainerRequest(
        pod_sandbox_id="p",
        config=v1.ContainerConfig(metadata=v1.ContainerMetadata(name="c"), labels={"app": "web"}, **config),
    )


SUPPLEMENTAL = create(
    linux=v1.LinuxContainerConfig(
        security_context=v1.LinuxContainerSecurityContext(supplemental_groups_policy=v1.Strict)
    )
)
RRO = create(
    mounts=[v1.Mount(container_path="/a"), v1.Mount(container_path="/b", readonly=True, recursive_read_only=True)]
)
SANDBOX = v1.RunPodSandboxRequest(
    config=v1.PodSandboxConfig(
        labels={"app": "web"},
        linux=v1.LinuxPodSandboxConfig(
            sysctls={"net.core.somaxconn": "1024"},
            security_context=v1.LinuxSandboxSecurityContext(supplemental_groups_policy=v1.Strict),
        ),
    ),
    runtime_handler="runc",
)
ENUM_VALUE = create(mounts=[v1.Mount(container_path="/a", propagation=7)])  # no MountPropagation 7
CASES: list[tuple[type[Message], bytes]] = [
    (v1.CreateContainerRequest, serialized(SUPPLEMENTAL)),
    (v1.CreateContainerRequest, serialized(RRO)),
    (v1.RunPodSandboxRequest, serialized(SANDBOX)),
    (v1.CreateContainerRequest, serialized(ENUM_VALUE)),
    (v1.CreateContainerRequest, serialized(create(stop_signal=v1.SIGTERM)) + _field(999, b"new")),
]
IDS = ["supplemental-groups", "rro", "run-pod-sandbox", "enum-value", "unknown-field"]


def paths(msg: Message) -> tuple[list[str], list[str]]:
    return v1_only_fields(msg), unknown_to_schema(msg)


def test_the_twin_keeps_names_and_numbers_with_strings_as_bytes() -> None:
    for desc in walk_messages(V1_FILE):
        twin = lenient.twin_class(GetMessageClass(desc)).DESCRIPTOR
        assert twin.full_name == desc.full_name
        assert lenient.is_map_entry(twin) == bool(desc.GetOptions().map_entry)
        for field in desc.fields:
            twin_field = twin.fields_by_number[field.number]
            assert twin_field.name == field.name
            assert twin_field.is_repeated == field.is_repeated
            if field.type == FieldDescriptor.TYPE_STRING:
                assert twin_field.type == FieldDescriptor.TYPE_BYTES
            else:
                assert twin_field.type == field.type
    assert lenient.twin_class(v1.CreateContainerRequest) is lenient.twin_class(v1.CreateContainerRequest)


@pytest.mark.parametrize(("cls", "raw"), CASES, ids=IDS)
def test_schemadiff_finds_the_same_paths_in_the_twin(cls: type[Message], raw: bytes) -> None:
    real = cls.FromString(raw)
    twin = lenient.twin_class(cls).FromString(raw)
    assert twin.DESCRIPTOR.full_name == real.DESCRIPTOR.full_name
    assert paths(twin) == paths(real)
    assert paths(real) != ([], [])


@pytest.mark.parametrize("desc", list(walk_messages(V1_FILE)), ids=lambda d: d.name)
def test_schemadiff_finds_the_same_paths_in_a_filled_twin(desc: object) -> None:
    cls = GetMessageClass(desc)
    raw = serialized(fill(cls()))
    assert paths(lenient.twin_class(cls).FromString(raw)) == paths(cls.FromString(raw))


@pytest.mark.parametrize(("cls", "raw"), CASES, ids=IDS)
def test_a_non_utf8_string_fails_v1_but_not_the_twin(cls: type[Message], raw: bytes) -> None:
    expected = paths(cls.FromString(raw))
    msg = cls.FromString(raw)
    msg.MergeFrom(cls.FromString(serialized(_with_placeholders(cls()))))
    bad = not_utf8(msg)
    with pytest.raises(DecodeError):
        cls.FromString(bad)
    parsed = lenient.parse(cls, bad)
    assert parsed.DESCRIPTOR.full_name == cls.DESCRIPTOR.full_name
    assert paths(parsed) == expected


def _with_placeholders(msg: Message) -> Message:
    """Non-UTF-8 to be: a label key and value, and an annotation value."""
    if isinstance(msg, v1.CreateContainerRequest):
        msg.config.labels[PLACEHOLDER] = PLACEHOLDER
        msg.config.annotations["a"] = PLACEHOLDER
    else:
        assert isinstance(msg, v1.RunPodSandboxRequest)
        msg.config.labels[PLACEHOLDER] = PLACEHOLDER
        msg.config.linux.sysctls["k"] = PLACEHOLDER
    return msg


def test_parse_uses_the_v1_class_when_it_can() -> None:
    raw = serialized(SUPPLEMENTAL)
    assert type(lenient.parse(v1.CreateContainerRequest, raw)) is v1.CreateContainerRequest


def test_parse_raises_for_what_is_no_message_at_all() -> None:
    for garbage in (b"\xff\xff\xff\xff", serialized(SUPPLEMENTAL)[:-1], b"\x0a\x05ab"):
        with pytest.raises(DecodeError):
            lenient.parse(v1.CreateContainerRequest, garbage)


def test_maps_with_message_values_in_the_twin() -> None:
    """CRI v1's maps are all string -> string; a synthetic schema has map<string, Node>."""
    new, old = synthetic_files()
    diff = SchemaDiff(new, old)
    node_cls = GetMessageClass(new.message_types_by_name["Node"])
    node = node_cls(name="n")
    node.kids["k"].extra = 1
    node.kids["j"].name = "only common"
    node.kids["i"].kids["deep"].mode = 2
    raw = serialized(node)
    twin_cls = lenient.twin_class(node_cls)
    assert diff.new_fields(twin_cls.FromString(raw)) == diff.new_fields(node_cls.FromString(raw)) == [
        "kids['i'].kids['deep'].mode=C",
        "kids['k'].extra",
    ]
    # A key repeated on the wire: the last entry wins, as in a map.
    again = serialized(node_cls(kids={"k": node_cls(name="replaced")}))
    assert diff.new_fields(twin_cls.FromString(raw + again)) == diff.new_fields(node_cls.FromString(raw + again))
    # A non-UTF-8 key reads with backslash escapes.
    bad = serialized(node_cls(kids={PLACEHOLDER: node_cls(extra=1)})).replace(PLACEHOLDER.encode(), NOT_UTF8)
    with pytest.raises(DecodeError):
        node_cls.FromString(bad)
    assert diff.new_fields(lenient.parse(node_cls, bad)) == ["kids['\\\\xff\\\\xfe" + "\\\\x80" * 9 + "'].extra"]
