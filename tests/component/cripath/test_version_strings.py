"""A runtime whose Version strings are not UTF-8 (raw bytes on the wire):
probed and served, its strings read leniently, and its Version answer
relayed to the client byte for byte, natively and translated. On both data
paths (tests/component/grpcpath/)."""

from __future__ import annotations

import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.cripath import lenient

from ..fakes import FakeBackend

# What upb refuses to read as a proto3 string, in every string field.
ODD = lenient.twin_class(v1.VersionResponse)(
    version=b"0.1.0", runtime_name=b"fake\xff", runtime_version=b"1.\xfe0", runtime_api_version=b"v1\xc3"
).SerializeToString()


def test_the_answer_is_not_a_v1_message() -> None:
    with pytest.raises(Exception, match="UTF-8|utf-8|Error parsing"):
        v1.VersionResponse.FromString(ODD)


@pytest.mark.parametrize("client_version", ["v1", "v1alpha2"])
async def test_a_runtime_with_non_utf8_version_strings_is_served(sock_dir, start_proxy, client_version) -> None:
    async with FakeBackend(sock_dir / "b.sock", versions=frozenset({"v1"})) as fake:
        fake.script("/runtime.v1.RuntimeService/Version", response=ODD)
        proxy = await start_proxy(fake.socket, wait=False, serve_versions="v1,v1alpha2")
        await proxy.wait_ready(5)  # probed
        info = proxy.backend.info
        assert info is not None and info.versions == {"v1"}
        assert (info.runtime_name, info.runtime_version) == ("fake\\xff", "1.\\xfe0")  # its odd bytes escaped
        async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as channel:
            path = f"/runtime.{client_version}.RuntimeService/Version"
            answer = await channel.unary_unary(path)(b"", timeout=5)
            assert answer == ODD
            # and the runtime's other calls are served
            containers = await channel.unary_unary(f"/runtime.{client_version}.RuntimeService/ListContainers")(
                b"", timeout=5
            )
            assert containers == b""
        assert fake.calls("/runtime.v1.RuntimeService/ListContainers")


async def test_a_probe_of_such_a_runtime_is_the_same_runtime_each_time(sock_dir, start_proxy) -> None:
    """The idle-reconnect check compares probes: the lenient reading is stable."""
    async with FakeBackend(sock_dir / "b.sock", versions=frozenset({"v1"})) as fake:
        fake.script("/runtime.v1.RuntimeService/Version", response=ODD)
        proxy = await start_proxy(fake.socket)
        assert await proxy.backend.probe_once() == proxy.backend.info
