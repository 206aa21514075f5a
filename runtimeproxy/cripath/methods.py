"""The CRI method table: versions, method paths and their message classes.

CRI ``runtime.v1alpha2`` and ``runtime.v1`` share field numbers and wire types
for every common message (v1 only adds fields, messages, enums and methods;
``tests/unit/cripath/test_schema_compat.py`` enforces this against the schema
copies). So a *call* converts by rewriting its path,
``/runtime.v1alpha2.RuntimeService/X`` <-> ``/runtime.v1.RuntimeService/X``
(:meth:`MethodRef.in_version`), and the request and response bytes are
forwarded unchanged.

Inside the proxy everything that reads or changes messages works on v1
objects: bytes of either version are parsed with the v1 class directly
(``METHODS[V1][ref.in_version(V1).path].request.FromString(data)``); what a
v1 message holds that v1alpha2 lacks is :mod:`.schemadiff`'s business.

Version constants: :class:`ApiVersion` is a ``StrEnum`` (members compare
equal to ``"v1"`` / ``"v1alpha2"``); ``V1`` and ``V1ALPHA2`` are shorthands.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from google.protobuf.descriptor import FileDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

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

FILES: Final[Mapping[ApiVersion, FileDescriptor]] = MappingProxyType(
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


PACKAGES: Final = MappingProxyType({v.package: v for v in ApiVersion})


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
    version = PACKAGES.get(package)
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
    {version: _methods(file) for version, file in FILES.items()}
)


def _qualified_names(version: ApiVersion) -> frozenset[str]:
    return frozenset(f"{i.service}/{i.name}" for i in METHODS[version].values())


# Service-qualified names (``RuntimeService/CheckpointContainer``), matching
# MethodRef.qualified_name: calls a v1alpha2-only backend cannot serve.
V1_ONLY_METHODS: Final = _qualified_names(V1) - _qualified_names(V1ALPHA2)


# --------------------------------------------------------------------------- metric labels

# What a metric's method label says for a method our schemas lack: any client
# can invent method names (each one is still forwarded), and a label per name
# would grow the metrics without bound.
UNKNOWN_METHOD: Final = "unknown"
KNOWN_METHODS: Final = _qualified_names(V1) | _qualified_names(V1ALPHA2)


def metric_ref(ref: MethodRef) -> MethodRef:
    """``ref`` as the per-call metrics label it: its method when a schema we
    carry has it under that service (in either version), else UNKNOWN_METHOD."""
    return ref if ref.qualified_name in KNOWN_METHODS else dataclasses.replace(ref, method=UNKNOWN_METHOD)
