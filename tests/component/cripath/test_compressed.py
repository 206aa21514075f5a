"""Compressed requests of calls the proxy reads (translated, hooked): served on
both data paths alike (the frames path inflates them before re-issuing)."""

from __future__ import annotations

import grpc
import pytest

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.cripath.stage import StageProvider

from ..fakes import FakeBackend

LIST = "ListContainers"
REQUEST = v1.ListContainersRequest(
    filter=v1.ContainerFilter(label_selector={f"k{i}": "v" * 50 for i in range(50)})).SerializeToString()
ANSWER = v1.ListContainersResponse(containers=[v1.Container(id="c1")]).SerializeToString()


class PassOn(StageProvider):
    """A stage on ListContainers that reads nothing and changes nothing."""

    def stage_for(self, method, client_version, backend_version):  # type: ignore[no-untyped-def]
        if method != LIST:
            return None

        async def stage(request, context, send):  # type: ignore[no-untyped-def]
            return await send(request)

        return stage


@pytest.mark.parametrize("data_path", ["frames", "grpc"])
@pytest.mark.parametrize("how", ["translated", "hooked"])
async def test_a_gzip_request_of_a_call_the_proxy_reads_is_served(sock_dir, start_proxy, client, data_path, how) -> None:
    version = "v1alpha2" if how == "translated" else "v1"
    async with FakeBackend(sock_dir / "b.sock", versions=frozenset({version})) as fake:
        fake.script(f"/runtime.{version}.RuntimeService/{LIST}", response=ANSWER)
        stages = (PassOn(),) if how == "hooked" else ()
        await start_proxy(fake.socket, data_path=data_path, serve_versions="v1,v1alpha2", stages=stages)
        call = client.unary_unary(f"/runtime.v1.RuntimeService/{LIST}")
        assert await call(REQUEST, compression=grpc.Compression.Gzip, timeout=10) == ANSWER
        [received] = fake.calls(f"/runtime.{version}.RuntimeService/{LIST}")
        assert v1.ListContainersRequest.FromString(received.requests[0]) == v1.ListContainersRequest.FromString(REQUEST)
