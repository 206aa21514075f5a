"""A lenient twin of a proto schema: every ``string`` field is ``bytes``.

upb refuses (``DecodeError``) to parse a proto3 ``string`` holding invalid
UTF-8, so bytes that carry, say, a non-UTF-8 label value cannot be parsed as
the v1 message at all.  What must still be inspected (:mod:`.fieldcheck`: the
fields a v1alpha2 runtime would drop) is inspected on the twin instead: the
same message full names, field names and numbers, enums and unknown fields,
so :mod:`.schemadiff`'s tables, keyed by full name, apply to it unchanged.

Maps: protobuf refuses ``bytes`` map keys, so a twin map-entry message loses
its ``map_entry`` option and the map becomes a repeated message field;
:func:`is_map_entry` still says it is one (:func:`.schemadiff.map_items`
reads both kinds alike).  The twin is used for inspection only: the original
bytes are what is forwarded, never a re-encoding.
"""

from __future__ import annotations

import functools
from typing import Final

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor, FileDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

_STRING: Final = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_BYTES: Final = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES

# Full names of twin messages that are map entries in the original schema
# (a message of the same full name in the original is one as well): a memo
# of immutable schemas, filled only by the cached ``_twin_pool``.
_UNMAPPED_ENTRIES: set[str] = set()


def _loosen(message: descriptor_pb2.DescriptorProto, prefix: str) -> None:
    full_name = f"{prefix}.{message.name}"
    if message.options.map_entry:
        message.options.ClearField("map_entry")
        _UNMAPPED_ENTRIES.add(full_name)
    for field in message.field:
        if field.type == _STRING:
            field.type = _BYTES
    for nested in message.nested_type:
        _loosen(nested, full_name)


def _add_file(file: FileDescriptor, pool: descriptor_pool.DescriptorPool) -> None:
    for dependency in file.dependencies:
        _add_file(dependency, pool)
    try:
        pool.FindFileByName(file.name)
        return  # already there (a shared dependency)
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    for message in proto.message_type:
        _loosen(message, proto.package)
    pool.Add(proto)


@functools.cache
def _twin_pool(file: FileDescriptor) -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    _add_file(file, pool)
    return pool


def twin_class(cls: type[Message]) -> type[Message]:
    """The lenient twin of message class ``cls`` (its file's twin built once, on first use)."""
    desc = cls.DESCRIPTOR
    return GetMessageClass(_twin_pool(desc.file).FindMessageTypeByName(desc.full_name))


def is_map_entry(desc: Descriptor) -> bool:
    """Whether ``desc`` is a map entry, or the twin of one."""
    return bool(desc.GetOptions().map_entry) or desc.full_name in _UNMAPPED_ENTRIES


def parse(cls: type[Message], data: bytes) -> Message:
    """``data`` as a ``cls``, or as its lenient twin when a string is not UTF-8.

    Raises ``DecodeError`` only when ``data`` is no such message at all.
    """
    try:
        return cls.FromString(data)
    except DecodeError:
        return twin_class(cls).FromString(data)
