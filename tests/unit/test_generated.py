"""The generated protocol modules match the schema copies, and the schema
copies match the upstream wire contracts."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from cri_api import regenerate
from runtimeproxy.config import load

from ..prerequisites import fail_or_skip

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("RUNTIME_PROXY_SHARED", ROOT.parent / "shared"))


# The generator's own version, stamped into each *_pb2_grpc.py as the oldest
# grpcio it runs on: a grpcio-tools release changes it and nothing else.
_GRPC_STAMP = re.compile(rb"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", re.MULTILINE)
# The protobuf runtime a *_pb2.py needs at least (major, minor, patch).
_PROTOBUF_STAMP = re.compile(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),")


def _unstamped(code: bytes) -> bytes:
    return _GRPC_STAMP.sub(b"GRPC_GENERATED_VERSION = ''", code)


def test_generated_modules_are_fresh(tmp_path: Path) -> None:
    written = regenerate.generate(tmp_path)
    assert len(written) == len(regenerate.GENERATED_SUFFIXES) * len(regenerate.SCHEMAS)
    stale = [
        str(path.relative_to(tmp_path))
        for path in written
        if _unstamped(path.read_bytes()) != _unstamped((ROOT / path.relative_to(tmp_path)).read_bytes())
    ]
    assert not stale, f"regenerate with `python -m cri_api.regenerate`: {stale} are stale"


def _floor(requirement: str) -> tuple[int, ...]:
    """The lower bound of a ``name>=x.y.z`` dependency of pyproject.toml."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        dependencies = tomllib.load(file)["project"]["dependencies"]
    spec = next(d for d in dependencies if d.split(">=")[0].strip() == requirement)
    return tuple(int(part) for part in spec.split(">=")[1].split(",")[0].strip().split("."))


def test_the_dependency_floors_admit_the_generated_modules() -> None:
    """pip may install the oldest grpcio and protobuf pyproject.toml allows: the
    generated modules refuse to import on anything older than they were made for."""
    grpc_needs = {
        tuple(int(part) for part in match.group(1).decode().split("."))
        for path in (ROOT / "cri_api").rglob("*_pb2_grpc.py")
        for match in _GRPC_STAMP.finditer(path.read_bytes())
    }
    protobuf_needs = {
        tuple(int(part) for part in match.groups())
        for path in (ROOT / "cri_api").rglob("*_pb2.py")
        for match in _PROTOBUF_STAMP.finditer(path.read_text())
    }
    assert grpc_needs and protobuf_needs
    assert _floor("grpcio") >= max(grpc_needs)
    assert _floor("protobuf") >= max(protobuf_needs)


@pytest.mark.parametrize("copy", sorted(regenerate.SCHEMAS))
def test_schema_copy_is_the_reduced_upstream(copy: str) -> None:
    upstream = SHARED / regenerate.SCHEMAS[copy]
    if not upstream.is_file():
        fail_or_skip(f"no upstream contract at {upstream} (set RUNTIME_PROXY_SHARED)")
    ours = (ROOT / "cri_api" / copy).read_text()
    assert ours == regenerate.reduce_schema(upstream.read_text())
    assert "Licensed under the Apache License" in ours
    assert "gogoproto" not in ours and "//" not in ours.split("*/", 1)[1].replace("://", "")


def test_reduction_keeps_the_wire_schema() -> None:
    """Same messages, fields, numbers and types as protoc reads upstream."""
    from cri_api.v1 import api_pb2 as v1

    proto = descriptor_pb2.FileDescriptorProto()
    v1.DESCRIPTOR.CopyToProto(proto)
    names = {m.name for m in proto.message_type}
    assert {"RunPodSandboxRequest", "KeyValue", "LinuxContainerResources"} <= names
    kv = next(m for m in proto.message_type if m.name == "KeyValue")
    assert [(f.name, f.number, f.type) for f in kv.field] == [
        ("key", 1, descriptor_pb2.FieldDescriptorProto.TYPE_STRING),
        ("value", 2, descriptor_pb2.FieldDescriptorProto.TYPE_BYTES),
    ]


def test_shipped_config_example_loads() -> None:
    config = load(ROOT / "systemd" / "config.yaml")
    assert config.listen == Path("/var/run/runtime-proxy/runtime-proxy.sock")
    assert config.hook_dir == Path("/etc/runtime/hookserver.d")
    assert config.max_recv_message_bytes == 16 * 1024 * 1024
    assert config.log_format == "json"
