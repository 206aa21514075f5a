"""A message's unknown fields, in wire order: each has ``field_number``,
``wire_type`` and ``data`` (protobuf's ``UnknownFieldSet``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet


def unknown_fields(msg: Message) -> Iterator[Any]:
    # iter(): the set iterates by __getitem__ (up to IndexError), which a for
    # over it does too, but types-protobuf declares no __iter__ for mypy.
    # Any: the stubs do not name protobuf's field type.
    return iter(UnknownFieldSet(msg))
