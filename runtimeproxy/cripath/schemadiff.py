"""What a CRI v1 message carries that v1alpha2 (or this copy of the schema) lacks.

A v1 request bound for a v1alpha2 runtime is forwarded as the same bytes, so
fields and enum values v1alpha2 does not know would be silently ignored by
the runtime; :func:`v1_only_fields` names them so the proxy can refuse such a
request, and :func:`request_needs_check` says which methods can carry any.
:class:`SchemaDiff` computes this once from the descriptors of both schemas.

Invalid UTF-8 (finding, protobuf 7 / upb): parsing a proto3 ``string`` field
holding invalid UTF-8 raises ``google.protobuf.message.DecodeError`` ("String
field had bad UTF-8"), and a Python ``str`` that cannot be encoded (lone
surrogates) cannot be assigned.  ``KeyValue.value`` (container env values) is
``bytes`` in v1 but ``string`` in v1alpha2, so v1 bytes with a non-UTF-8 env
value parse fine as v1 but *fail* as v1alpha2.  Hence the proxy never parses
bytes as v1alpha2 objects: everything here inspects the v1 object and the
descriptors only.  Bytes that fail to parse as v1 (a non-UTF-8 ``string``,
e.g. a label value) are inspected as the v1 schema's lenient twin instead
(:mod:`.lenient`: every ``string`` a ``bytes``, same full names and numbers),
which everything here reads exactly like a v1 object.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, Final

from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    FileDescriptor,
)
from google.protobuf.message import Message

from .lenient import is_map_entry
from .unknownfields import unknown_fields
from .methods import FILES, METHODS, V1, V1ALPHA2

# The walks below run on the event loop, on a request up to 16 MiB: bounded,
# so that one hostile request cannot hold every other call for seconds.
MAX_VISITS: Final = 50_000  # messages and unknown fields looked at, per request
MAX_FINDINGS: Final = 10_000  # distinct findings kept (named in a summary, fieldcheck.summarize)
MAX_UNKNOWN_NAMED: Final = 64 << 10  # unknown bytes beyond which they are counted, not named
TOO_MANY: Final = f"(over {MAX_VISITS} values: more than runtime-proxy checks)"


class _Enough(Exception):
    """The walk has found enough, or looked long enough."""


class _Walk:
    __slots__ = ("found", "visits", "unknown")

    def __init__(self, unknown: bool = True) -> None:
        self.found: dict[str, None] = {}  # ordered, each once
        self.visits = 0
        self.unknown = unknown  # whether to read unknown fields (there are some)

    def visit(self) -> None:
        self.visits += 1
        if self.visits > MAX_VISITS:
            raise _Enough

    def add(self, path: str) -> None:
        self.found[path] = None
        if len(self.found) >= MAX_FINDINGS:
            raise _Enough

# --------------------------------------------------------------------------- descriptors


def relative_name(desc: Descriptor | EnumDescriptor) -> str:
    """Name without the package: twins across versions share it."""
    full_name: str = desc.full_name
    return full_name.removeprefix(desc.file.package + ".")


def walk_messages(file: FileDescriptor) -> Iterator[Descriptor]:
    stack = list(file.message_types_by_name.values())
    while stack:
        desc = stack.pop()
        yield desc
        stack.extend(desc.nested_types)


def walk_enums(file: FileDescriptor) -> Iterator[EnumDescriptor]:
    yield from file.enum_types_by_name.values()
    for desc in walk_messages(file):
        yield from desc.enum_types


def map_items(value: Any) -> list[tuple[object, object]]:
    """(key, value) pairs of a map field's value, by key, for a v1 map and for
    its lenient twin's repeated entries alike (the last entry of a key wins,
    as in a map; a ``bytes`` key reads as the ``str`` it is in v1, invalid
    UTF-8 as backslash escapes)."""
    if isinstance(value, Mapping):  # a map container
        return [(key, value[key]) for key in sorted(value)]
    entries = {entry.key: entry.value for entry in value}
    return [
        (key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else key, entries[key])
        for key in sorted(entries)  # UTF-8 byte order is code point order, as in sorted(str)
    ]


# --------------------------------------------------------------------------- schema diff

_STRING_LIKE: Final = frozenset({FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES})


def _compatible(new: FieldDescriptor, old: FieldDescriptor) -> bool:
    """Whether the old version reads the new field's bytes as the same thing."""
    if new.is_repeated != old.is_repeated:
        return False
    if new.type != old.type:
        return {new.type, old.type} <= _STRING_LIKE  # both length-delimited
    # (old's type is new's here, so old has a message or enum type when new has)
    if new.message_type is not None:
        return old.message_type is not None and relative_name(new.message_type) == relative_name(old.message_type)
    if new.enum_type is not None:
        return old.enum_type is not None and relative_name(new.enum_type) == relative_name(old.enum_type)
    return True


class SchemaDiff:
    """What a newer schema can carry that an older one cannot understand.

    Built once from descriptors into immutable tables; the module-level
    functions use the instance for CRI v1 against v1alpha2.
    """

    def __init__(self, new: FileDescriptor, old: FileDescriptor) -> None:
        old_messages = {relative_name(d): d for d in walk_messages(old)}
        old_enums = {relative_name(e): e for e in walk_enums(old)}

        # message full name -> numbers of fields the old twin lacks (all of
        # them when there is no twin) or declares incompatibly
        unknown_fields: dict[str, frozenset[int]] = {}
        for desc in walk_messages(new):
            twin = old_messages.get(relative_name(desc))
            unknown_fields[desc.full_name] = frozenset(
                f.number
                for f in desc.fields
                if twin is None
                or f.number not in twin.fields_by_number
                or not _compatible(f, twin.fields_by_number[f.number])
            )

        # enum full name -> value numbers the old twin lacks
        unknown_values: dict[str, frozenset[int]] = {}
        for enum_desc in walk_enums(new):
            twin_enum = old_enums.get(relative_name(enum_desc))
            old_numbers = frozenset(twin_enum.values_by_number) if twin_enum else frozenset()
            unknown_values[enum_desc.full_name] = frozenset(enum_desc.values_by_number) - old_numbers

        # Fixed point instead of recursion: correct for recursive types too.
        may_carry = {
            name: bool(numbers) for name, numbers in unknown_fields.items()
        }
        changed = True
        while changed:
            changed = False
            for desc in walk_messages(new):
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
        """Dotted paths of set fields / enum values the old schema lacks
        (at most MAX_FINDINGS; TOO_MANY among them if the walk ran out
        first, so that what it did not reach is never taken as checked)."""
        walk = _Walk()
        try:
            self._collect(msg, "", walk)
        except _Enough:
            if walk.visits > MAX_VISITS:
                walk.found[TOO_MANY] = None
        return list(walk.found)

    def _collect(self, msg: Message, prefix: str, found: _Walk) -> None:
        desc = msg.DESCRIPTOR
        if not self._may_carry[desc.full_name]:
            return
        found.visit()
        unknown = self._unknown_fields[desc.full_name]
        # ListFields gives exactly the set fields under proto3 presence.
        for field, value in msg.ListFields():
            path = prefix + field.name
            if field.number in unknown:
                found.add(path)  # reported as a whole, not looked into
            elif not self._may_carry_field(field):
                continue
            elif field.message_type is not None and is_map_entry(field.message_type):
                value_field = field.message_type.fields_by_name["value"]
                for key, item in map_items(value):
                    self._collect_value(value_field, item, f"{path}[{key!r}]", found)
            elif field.is_repeated:
                for i, item in enumerate(value):
                    self._collect_value(field, item, f"{path}[{i}]", found)
            else:
                self._collect_value(field, value, path, found)

    def _may_carry_field(self, field: FieldDescriptor) -> bool:
        if field.message_type is not None:  # includes map entries
            return self._may_carry[field.message_type.full_name]
        return field.enum_type is not None and bool(self._unknown_values[field.enum_type.full_name])

    def _collect_value(self, field: FieldDescriptor, value: object, path: str, found: _Walk) -> None:
        found.visit()
        if field.message_type is not None:
            assert isinstance(value, Message)
            self._collect(value, path + ".", found)
        elif field.enum_type is not None and value in self._unknown_values[field.enum_type.full_name]:
            assert isinstance(value, int)
            found.add(f"{path}={field.enum_type.values_by_number[value].name}")


_V1_DIFF: Final = SchemaDiff(FILES[V1], FILES[V1ALPHA2])


def unknown_to_schema(msg: Message) -> list[str]:
    """Dotted paths of what ``msg`` carries that its own schema lacks: fields
    by number (``config.linux.#99``) and enum values (``protocol=7``), i.e.
    what a client newer than this copy of the proto set. Many unknown bytes
    are counted rather than named (naming them parses every one)."""
    bare = type(msg)()
    bare.CopyFrom(msg)
    bare.DiscardUnknownFields()  # in C: how many unknown bytes there are, without naming them
    unknown = msg.ByteSize() - bare.ByteSize()
    if unknown > MAX_UNKNOWN_NAMED:
        return [f"{unknown} bytes of fields"]
    walk = _Walk(unknown=unknown > 0)
    try:
        _collect_unknown(msg, "", walk)
    except _Enough:
        if walk.visits > MAX_VISITS:  # what the walk did not reach is not taken as known
            if unknown and not walk.found:
                return [f"{unknown} bytes of fields"]
            walk.found[TOO_MANY] = None
    return list(walk.found)  # a repeated unknown field is one finding


def _enum_holders(file: FileDescriptor) -> Mapping[str, bool]:
    """Per message type (full name): whether it can hold an enum value, at any depth."""
    holds: dict[str, bool] = {}

    def holds_enum(desc: Descriptor) -> bool:
        if desc.full_name not in holds:
            holds[desc.full_name] = False  # (a recursive type: what it holds is what its other fields hold)
            holds[desc.full_name] = any(
                f.enum_type is not None or (f.message_type is not None and holds_enum(f.message_type))
                for f in desc.fields)
        return holds[desc.full_name]

    for desc in walk_messages(file):
        holds_enum(desc)
    return MappingProxyType(holds)


_ENUM_HOLDERS: Final = _enum_holders(FILES[V1])  # the lenient twin shares v1's full names


def _holds_enum(desc: Descriptor) -> bool:
    return _ENUM_HOLDERS.get(desc.full_name, True)  # a type of another schema: looked into


def _collect_unknown(msg: Message, prefix: str, found: _Walk) -> None:
    found.visit()
    if found.unknown:
        for f in unknown_fields(msg):
            found.visit()
            found.add(f"{prefix}#{f.field_number}")
    for field, value in msg.ListFields():
        if not found.unknown and field.enum_type is None and (
                field.message_type is None or not _holds_enum(field.message_type)):
            continue  # no unknown bytes anywhere: only enum values can be unknown, and none is below
        path = prefix + field.name
        if field.message_type is not None and is_map_entry(field.message_type):
            value_field = field.message_type.fields_by_name["value"]
            for key, item in map_items(value):
                _collect_unknown_value(value_field, item, f"{path}[{key!r}]", found)
        elif field.is_repeated:
            for i, item in enumerate(value):
                _collect_unknown_value(field, item, f"{path}[{i}]", found)
        else:
            _collect_unknown_value(field, value, path, found)


def _collect_unknown_value(field: FieldDescriptor, value: object, path: str, found: _Walk) -> None:
    found.visit()
    if field.message_type is not None:
        assert isinstance(value, Message)
        _collect_unknown(value, path + ".", found)
    elif field.enum_type is not None and value not in field.enum_type.values_by_number:
        found.add(f"{path}={value}")


def may_carry_v1_only(desc: Descriptor) -> bool:
    """Whether a v1 message of this type can hold fields or enum values unknown to v1alpha2."""
    return _V1_DIFF.may_carry_new(desc)


def v1_only_fields(msg: Message) -> list[str]:
    """Dotted paths of what is set in v1 ``msg`` but unknown to v1alpha2.

    E.g. ``config.CDI_devices``, ``config.mounts[0].recursive_read_only``,
    ``annotations['k'].x``, ``x.network=NEW_VALUE`` (enum value).  A field whose
    message type has no v1alpha2 twin is reported as a whole.  Works on the v1
    object and descriptors only (never parses as v1alpha2, see the module doc).
    """
    return _V1_DIFF.new_fields(msg)


def _needs_check() -> Mapping[str, bool]:
    table: dict[str, bool] = {}
    for info in METHODS[V1].values():
        # Method names are unique across the CRI services; combine anyway.
        table[info.name] = table.get(info.name, False) or may_carry_v1_only(info.request.DESCRIPTOR)  # type: ignore[arg-type]  # types-protobuf splits upb's Descriptor from it
    return MappingProxyType(table)


_REQUEST_NEEDS_CHECK: Final = _needs_check()


def request_needs_check(method_name: str) -> bool:
    """Whether a v1 request of ``method_name`` (e.g. ``"CreateContainer"``) can
    carry v1-only fields, i.e. must be decoded before going to a v1alpha2
    backend.  False for methods we have no proto for.  Whether the method
    itself exists in v1alpha2 is :data:`V1_ONLY_METHODS`' business.
    """
    return _REQUEST_NEEDS_CHECK.get(method_name, False)
