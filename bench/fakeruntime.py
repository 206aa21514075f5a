"""A fake CRI runtime for measuring the proxy alone: every pod lifecycle call answered at once.

It serves ``runtime.v1`` only (``v1alpha2`` is UNIMPLEMENTED, as containerd 2
answers it), with no state: ``RunPodSandbox`` and ``CreateContainer`` answer a
new 64-hex-digit id (containerd's form), the lists answer empty and every
other method an empty message. Requests and answers are bytes, never
decoded, so that the process's own cost stays small and the same for every
proxy it is measured behind.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.host.unixsocket import grpc_address

SERVICE = "/runtime.v1.RuntimeService/"


@dataclass
class FakeRuntime:
    socket: Path
    calls: dict[str, int] = field(default_factory=dict)  # method -> calls answered
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    _server: aio.Server | None = None

    def answer(self, method: str) -> bytes:
        self.calls[method] = self.calls.get(method, 0) + 1
        if method == "Version":
            return v1.VersionResponse(version="0.1.0", runtime_name="fake", runtime_version="1.0",
                                      runtime_api_version="v1").SerializeToString()
        if method == "RunPodSandbox":
            return v1.RunPodSandboxResponse(pod_sandbox_id=f"{next(self._ids):064x}").SerializeToString()
        if method == "CreateContainer":
            return v1.CreateContainerResponse(container_id=f"{next(self._ids):064x}").SerializeToString()
        return b""

    async def start(self) -> None:
        self._server = aio.server()
        self._server.add_generic_rpc_handlers((_Handler(self),))
        self._server.add_insecure_port(grpc_address(self.socket))
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, runtime: FakeRuntime) -> None:
        self.runtime = runtime

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        path = details.method
        if not path.startswith(SERVICE):
            return None  # grpc answers UNIMPLEMENTED
        method = path[len(SERVICE):]

        async def unary(request: bytes, context: aio.ServicerContext) -> bytes:
            return self.runtime.answer(method)

        return grpc.unary_unary_rpc_method_handler(unary)
