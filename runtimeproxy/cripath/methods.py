"""Conversion between CRI ``runtime.v1alpha2`` and ``runtime.v1``.

The two versions share field numbers and wire types for every common message
(v1 only adds fields, messages, enums and methods; the schema test in
``tests/unit/cripath/test_methods.py`` enforces this against the schema copies). So:

* a *call* converts by rewriting its path, ``/runtime.v1alpha2.RuntimeService/X``
  <-> ``/runtime.v1.RuntimeService/X`` (:meth:`MethodRef.in_version`);
* a *message* converts by a byte round trip; on the wire the bytes are the
  same, so a proxy forwards request and response bytes unchanged and only
  rewrites the path.  :func:`to_v1` / :func:`to_v1alpha2` are for code that
  already holds a message object.

Inside the proxy everything that reads or changes messages works on v1
objects: bytes of either version are parsed with the v1 class directly
(``METHODS[V1][ref.in_version(V1).path].request.FromString(data)``).

Invalid UTF-8 (finding, protobuf 7 / upb): parsing a proto3 ``string`` field
holding invalid UTF-8 raises ``google.protobuf.message.DecodeError`` ("String
field had bad UTF-8"), and a Python ``str`` that cannot be encoded (lone
surrogates) cannot be assigned.  ``KeyValue.value`` (container env values) is
``bytes`` in v1 but ``string`` in v1alpha2, so v1 bytes with a non-UTF-8 env
value parse fine as v1 but *fail* as v1alpha2.  Hence the proxy never parses
bytes as v1alpha2 objects: :func:`v1_only_fields` inspects the v1 object and
the descriptors only, and :func:`to_v1alpha2` (which raises ``DecodeError``
for such a message) is not used on the hot path.

Version constants: :class:`ApiVersion` is a ``StrEnum`` (members compare
equal to ``"v1"`` / ``"v1alpha2"``); ``V1`` and ``V1ALPHA2`` are shorthands.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    FileDescriptor,
)
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from google.protobuf.unknown_fields import UnknownFieldSet

from cri_api.v1 import api_pb2 as _v1_pb2
from cri_api.v1alpha2 import api_pb2 as _v1alpha2_pb2


class ApiVersion(enum.StrEnum):
    V1 = "v1"
    V1ALPHA2 = "v1alpha2"

    @property
    def package(self) -> str:
        """The proto package, e.g. ``runtime.v1``."""
        return f"runtime.{self.value}"


V1: Final = ApiVersion.V1
V1ALPHA2: Final = ApiVersion.V1ALPHA2
SERVICES: Final = frozenset({"RuntimeService", "ImageService"})

_FILES: Final[Mapping[ApiVersion, FileDescriptor]] = MappingProxyType(
    {V1: _v1_pb2.DESCRIPTOR, V1ALPHA2: _v1alpha2_pb2.DESCRIPTOR}
)


# --------------------------------------------------------------------------- methods


@dataclass(frozen=True, slots=True)
class MethodRef:
    """A CRI method named by a gRPC path; the method need not be in our protos."""

    version: ApiVersion
    service: str
    method: str

    @property
    def path(self) -> str:
        return f"/{self.version.package}.{self.service}/{self.method}"

    @property
    def qualified_name(self) -> str:
        """Version-independent name, e.g. ``RuntimeService/Version``."""
        return f"{self.service}/{self.method}"

    def in_version(self, version: ApiVersion) -> MethodRef:
        return dataclasses.replace(self, version=version)


@dataclass(frozen=True, slots=True)
class MethodInfo:
    name: str
    service: str
    request: type[Message]
    response: type[Message]
    server_streaming: bool
    client_streaming: bool


_PACKAGES: Final = MappingProxyType({v.package: v for v in ApiVersion})


def parse_method(path: str) -> MethodRef | None:
    """``/runtime.v1.RuntimeService/Version`` -> MethodRef; None if not CRI."""
    # Unknown method names are accepted: a newer kubelet may call methods we
    # have no proto for, and those are still forwarded.
    if not path.startswith("/"):
        return None
    qualified_service, _, method = path[1:].partition("/")
    if not method or "/" in method:
        return None
    package, _, service = qualified_service.rpartition(".")
    version = _PACKAGES.get(package)
    if version is None or service not in SERVICES:
        return None
    return MethodRef(version, service, method)


def _methods(file: FileDescriptor) -> Mapping[str, MethodInfo]:
    return MappingProxyType(
        {
            f"/{service.full_name}/{m.name}": MethodInfo(
                name=m.name,
                service=service.name,
                request=GetMessageClass(m.input_type),
                response=GetMessageClass(m.output_type),
                server_streaming=m.server_streaming,
                client_streaming=m.client_streaming,
            )
            for service in file.services_by_name.values()
            for m in service.methods
        }
    )


# version -> full path -> MethodInfo
METHODS: Final[Mapping[ApiVersion, Mapping[str, MethodInfo]]] = MappingProxyType(
    {version: _methods(file) for version, file in _FILES.items()}
)


def _qualified_names(version: ApiVersion) -> frozenset[str]:
    return frozenset(f"{i.service}/{i.name}" for i in METHODS[version].values())


# Service-qualified names (``RuntimeService/CheckpointContainer``), matching
# MethodRef.qualified_name: calls a v1alpha2-only backend cannot serve.
V1_ONLY_METHODS: Final = _qualified_names(V1) - _qualified_names(V1ALPHA2)


# --------------------------------------------------------------------------- messages


def _relative_name(desc: Descriptor | EnumDescriptor) -> str:
    """Name without the package: twins across versions share it."""
    full_name: str = desc.full_name
    return full_name.removeprefix(desc.file.package + ".")


def _walk_messages(file: FileDescriptor) -> Iterator[Descriptor]:
    stack = list(file.message_types_by_name.values())
    while stack:
        desc = stack.pop()
        yield desc
        stack.extend(desc.nested_types)


def _walk_enums(file: FileDescriptor) -> Iterator[EnumDescriptor]:
    yield from file.enum_types_by_name.values()
    for desc in _walk_messages(file):
        yield from desc.enum_types


# version -> relative message name -> class
_CLASSES: Final[Mapping[ApiVersion, Mapping[str, type[Message]]]] = MappingProxyType(
    {
        version: MappingProxyType({_relative_name(d): GetMessageClass(d) for d in _walk_messages(file)})
        for version, file in _FILES.items()
    }
)


def convert(msg: Message, version: ApiVersion) -> Message:
    """The twin of ``msg`` in ``version`` (``msg`` itself if already there).

    Raises ValueError if the message type does not exist in ``version`` and
    DecodeError if a v1 ``bytes`` field that is a v1alpha2 ``string``
    (KeyValue.value) holds invalid UTF-8.  Unknown fields are kept, so v1-only
    fields survive a trip through v1alpha2.
    """
    desc = msg.DESCRIPTOR
    if desc.file.package == version.package:
        return msg
    if desc.file.package not in _PACKAGES:
        raise ValueError(f"{desc.full_name} is not a CRI message")
    cls = _CLASSES[version].get(_relative_name(desc))
    if cls is None:
        raise ValueError(f"{desc.full_name} has no twin in {version.package}")
    return cls.FromString(msg.SerializeToString())


def to_v1(msg: Message) -> Message:
    return convert(msg, V1)


def to_v1alpha2(msg: Message) -> Message:
    return convert(msg, V1ALPHA2)


# --------------------------------------------------------------------------- v1-only fields

_STRING_LIKE: Final = frozenset({FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES})


def _compatible(new: FieldDescriptor, old: FieldDescriptor) -> bool:
    """Whether the old version reads the new field's bytes as the same thing."""
    if new.is_repeated != old.is_repeated:
        return False
    if new.type != old.type:
        return {new.type, old.type} <= _STRING_LIKE  # both length-delimited
    if new.message_type is not None:
        return _relative_name(new.message_type) == _relative_name(old.message_type)
    if new.enum_type is not None:
        return _relative_name(new.enum_type) == _relative_name(old.enum_type)
    return True


class SchemaDiff:
    """What a newer schema can carry that an older one cannot understand.

    Built once from descriptors into immutable tables; the module-level
    functions use the instance for CRI v1 against v1alpha2.
    """

    def __init__(self, new: FileDescriptor, old: FileDescriptor) -> None:
        old_messages = {_relative_name(d): d for d in _walk_messages(old)}
        old_enums = {_relative_name(e): e for e in _walk_enums(old)}

        # message full name -> numbers of fields the old twin lacks (all of
        # them when there is no twin) or declares incompatibly
        unknown_fields: dict[str, frozenset[int]] = {}
        for desc in _walk_messages(new):
            twin = old_messages.get(_relative_name(desc))
            unknown_fields[desc.full_name] = frozenset(
                f.number
                for f in desc.fields
                if twin is None
                or f.number not in twin.fields_by_number
                or not _compatible(f, twin.fields_by_number[f.number])
            )

        # enum full name -> value numbers the old twin lacks
        unknown_values: dict[str, frozenset[int]] = {}
        for enum_desc in _walk_enums(new):
            twin_enum = old_enums.get(_relative_name(enum_desc))
            old_numbers = frozenset(twin_enum.values_by_number) if twin_enum else frozenset()
            unknown_values[enum_desc.full_name] = frozenset(enum_desc.values_by_number) - old_numbers

        # Fixed point instead of recursion: correct for recursive types too.
        may_carry = {
            name: bool(numbers) for name, numbers in unknown_fields.items()
        }
        changed = True
        while changed:
            changed = False
            for desc in _walk_messages(new):
                if may_carry[desc.full_name]:
                    continue
                if any(
                    (f.message_type is not None and may_carry[f.message_type.full_name])
                    or (f.enum_type is not None and unknown_values[f.enum_type.full_name])
                    for f in desc.fields
                ):
                    may_carry[desc.full_name] = changed = True

        self._unknown_fields: Mapping[str, frozenset[int]] = MappingProxyType(unknown_fields)
        self._unknown_values: Mapping[str, frozenset[int]] = MappingProxyType(unknown_values)
        self._may_carry: Mapping[str, bool] = MappingProxyType(may_carry)

    def may_carry_new(self, desc: Descriptor) -> bool:
        """Whether any instance of ``desc`` can hold something the old schema lacks."""
        return self._may_carry[desc.full_name]

    def new_fields(self, msg: Message) -> list[str]:
        """Dotted paths of set fields / enum values the old schema lacks."""
        found: list[str] = []
        self._collect(msg, "", found)
        return found

    def _collect(self, msg: Message, prefix: str, found: list[str]) -> None:
        desc = msg.DESCRIPTOR
        if not self._may_carry[desc.full_name]:
            return
        unknown = self._unknown_fields[desc.full_name]
        # ListFields gives exactly the set fields under proto3 presence.
        for field, value in msg.ListFields():
            path = prefix + field.name
            if field.number in unknown:
                found.append(path)  # reported as a whole, not looked into
            elif not self._may_carry_field(field):
                continue
            elif field.message_type is not None and field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                for key in sorted(value):
                    self._collect_value(value_field, value[key], f"{path}[{key!r}]", found)
            elif field.is_repeated:
                for i, item in enumerate(value):
                    self._collect_value(field, item, f"{path}[{i}]", found)
            else:
                self._collect_value(field, value, path, found)

    def _may_carry_field(self, field: FieldDescriptor) -> bool:
        if field.message_type is not None:  # includes map entries
            return self._may_carry[field.message_type.full_name]
        return field.enum_type is not None and bool(self._unknown_values[field.enum_type.full_name])

    def _collect_value(self, field: FieldDescriptor, value: object, path: str, found: list[str]) -> None:
        if field.message_type is not None:
            assert isinstance(value, Message)
            self._collect(value, path + ".", found)
        elif field.enum_type is not None and value in self._unknown_values[field.enum_type.full_name]:
            assert isinstance(value, int)
            found.append(f"{path}={field.enum_type.values_by_number[value].name}")


_V1_DIFF: Final = SchemaDiff(_v1_pb2.DESCRIPTOR, _v1alpha2_pb2.DESCRIPTOR)


def unknown_to_schema(msg: Message) -> list[str]:
    """Dotted paths of what ``msg`` carries that its own schema lacks: fields
    by number (``config.linux.#99``) and enum values (``protocol=7``), i.e.
    what a client newer than this copy of the proto set."""
    found: list[str] = []
    _collect_unknown(msg, "", found)
    return list(dict.fromkeys(found))  # a repeated unknown field is one finding


def _collect_unknown(msg: Message, prefix: str, found: list[str]) -> None:
    found.extend(f"{prefix}#{f.field_number}" for f in UnknownFieldSet(msg))
    for field, value in msg.ListFields():
        path = prefix + field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for key in sorted(value):
                _collect_unknown_value(value_field, value[key], f"{path}[{key!r}]", found)
        elif field.is_repeated:
            for i, item in enumerate(value):
                _collect_unknown_value(field, item, f"{path}[{i}]", found)
        else:
            _collect_unknown_value(field, value, path, found)


def _collect_unknown_value(field: FieldDescriptor, value: object, path: str, found: list[str]) -> None:
    if field.message_type is not None:
        assert isinstance(value, Message)
        _collect_unknown(value, path + ".", found)
    elif field.enum_type is not None and value not in field.enum_type.values_by_number:
        found.append(f"{path}={value}")


def may_carry_v1_only(desc: Descriptor) -> bool:
    """Whether a v1 message of this type can hold fields or enum values unknown to v1alpha2."""
    return _V1_DIFF.may_carry_new(desc)


def v1_only_fields(msg: Message) -> list[str]:
    """Dotted paths of what is set in v1 ``msg`` but unknown to v1alpha2.

    E.g. ``config.CDI_devices``, ``config.mounts[0].recursive_read_only``,
    ``annotations['k'].x``, ``x.network=NEW_VALUE`` (enum value).  A field whose
    message type has no v1alpha2 twin is reported as a whole.  Works on the v1
    object and descriptors only (never parses as v1alpha2, see module doc).
    """
    return _V1_DIFF.new_fields(msg)


def _needs_check() -> Mapping[str, bool]:
    table: dict[str, bool] = {}
    for info in METHODS[V1].values():
        # Method names are unique across the CRI services; combine anyway.
        table[info.name] = table.get(info.name, False) or may_carry_v1_only(info.request.DESCRIPTOR)
    return MappingProxyType(table)


_REQUEST_NEEDS_CHECK: Final = _needs_check()


def request_needs_check(method_name: str) -> bool:
    """Whether a v1 request of ``method_name`` (e.g. ``"CreateContainer"``) can
    carry v1-only fields, i.e. must be decoded before going to a v1alpha2
    backend.  False for methods we have no proto for.  Whether the method
    itself exists in v1alpha2 is :data:`V1_ONLY_METHODS`' business.
    """
    return _REQUEST_NEEDS_CHECK.get(method_name, False)
