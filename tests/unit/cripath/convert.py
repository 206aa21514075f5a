"""Conversion of a CRI message object to its twin in the other version, for tests.

The proxy itself never converts message objects: it forwards bytes and parses
them as v1 only (see runtimeproxy.cripath.methods and .schemadiff). The tests
use this to show that the two schemas are wire-compatible.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from runtimeproxy.cripath.methods import FILES, PACKAGES, V1, V1ALPHA2, ApiVersion
from runtimeproxy.cripath.schemadiff import relative_name, walk_messages

from .schemas import descriptor_of

# version -> relative message name -> class
_CLASSES: Final[Mapping[ApiVersion, Mapping[str, type[Message]]]] = MappingProxyType(
    {
        version: MappingProxyType({relative_name(d): GetMessageClass(d) for d in walk_messages(file)})
        for version, file in FILES.items()
    }
)


def convert(msg: Message, version: ApiVersion) -> Message:
    """The twin of ``msg`` in ``version`` (``msg`` itself if already there).

    Raises ValueError if the message type does not exist in ``version`` and
    DecodeError if a v1 ``bytes`` field that is a v1alpha2 ``string``
    (KeyValue.value) holds invalid UTF-8.  Unknown fields are kept, so v1-only
    fields survive a trip through v1alpha2.
    """
    desc = descriptor_of(msg)
    if desc.file.package == version.package:
        return msg
    if desc.file.package not in PACKAGES:
        raise ValueError(f"{desc.full_name} is not a CRI message")
    cls = _CLASSES[version].get(relative_name(desc))
    if cls is None:
        raise ValueError(f"{desc.full_name} has no twin in {version.package}")
    return cls.FromString(msg.SerializeToString())


def to_v1(msg: Message) -> Message:
    return convert(msg, V1)


def to_v1alpha2(msg: Message) -> Message:
    return convert(msg, V1ALPHA2)
