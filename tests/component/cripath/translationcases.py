"""What the CRI v1alpha2 <-> v1 translation tests share: the CRI versions a fake backend
serves, requests in either version's schema, and the fixtures that start a fake backend
and a proxy in front of it (each test module binds them for pytest to find)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cri_api.v1 import api_pb2 as v1
from cri_api.v1alpha2 import api_pb2 as v1alpha2
from runtimeproxy.cripath.fieldcheck import V1OnlyFieldCheck

from ..fakes import FakeBackend, is_probe

ONLY_V1 = frozenset({"v1"})
ONLY_V1ALPHA2 = frozenset({"v1alpha2"})
BOTH = frozenset({"v1", "v1alpha2"})

UNKNOWN_FIELD = bytes([0xBA, 0x3E, 0x03]) + b"xyz"  # field 999, length 3: no schema knows it


def path(version: str, method: str, service: str = "RuntimeService") -> str:
    return f"/runtime.{version}.{service}/{method}"


def api(version: str) -> ModuleType:
    return v1 if version == "v1" else v1alpha2


def backend_paths(fake: FakeBackend) -> list[str]:
    """What reached the backend, apart from the proxy's version probes."""
    return [r.path for r in fake.received if not is_probe(r.path)]


def common_create(version: str) -> Any:
    """A CreateContainerRequest with fields both versions have, in the client's own schema."""
    m = api(version)
    return m.CreateContainerRequest(
        pod_sandbox_id="pod-1",
        config=m.ContainerConfig(
            metadata=m.ContainerMetadata(name="app", attempt=1),
            image=m.ImageSpec(image="busybox", annotations={"a": "b"}),
            command=["sleep", "1"],
            envs=[m.KeyValue(key="K", value=b"v" if version == "v1" else "v")],
            mounts=[m.Mount(container_path="/data", host_path="/srv", readonly=True, propagation=1)],
            labels={"app": "web"},
            linux=m.LinuxContainerConfig(
                resources=m.LinuxContainerResources(cpu_shares=256, memory_limit_in_bytes=1 << 30),
                security_context=m.LinuxContainerSecurityContext(run_as_user=m.Int64Value(value=1000)),
            ),
        ),
        sandbox_config=m.PodSandboxConfig(metadata=m.PodSandboxMetadata(name="web", uid="u", namespace="default")),
    )


def create_with(**config: Any) -> v1.CreateContainerRequest:
    request = common_create("v1")
    request.config.MergeFrom(v1.ContainerConfig(**config))
    return request


@pytest.fixture
async def backend(sock_dir: Path) -> AsyncIterator[Any]:
    """Start a fake backend serving the given versions (stopped afterwards)."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(versions: frozenset[str]) -> FakeBackend:
            return await stack.enter_async_context(FakeBackend(sock_dir / "b.sock", versions=versions))

        yield start


@pytest.fixture
def proxy_for(backend: Any, start_proxy: Any) -> Any:
    async def start(versions: frozenset[str], forward_unknown: bool = False, **settings: Any) -> tuple[FakeBackend, Any]:
        fake = await backend(versions)
        proxy = await start_proxy(fake.socket, stages=(V1OnlyFieldCheck(forward_unknown),), **settings)
        return fake, proxy

    return start
