"""A frames connection reads what each call needs from its header block
(route, grpc-timeout, grpc-encoding, whether it is gRPC at all) once per
distinct block: the proxy's hook client sends the same stateless block for
every call of one method and timeout. Guards existing behaviour: calls
whose blocks repeat, alternate and change on one connection are each
routed and timed by their own headers."""

from __future__ import annotations

import grpc

from cri_api.hookapi import api_pb2 as hookapi
from runtimeproxy.hookclient.pool import FramesTransport
from runtimeproxy.hookclient.transport import CallFailed

from . import scriptedserver
from .scriptedserver import PRE_CREATE, PRE_RUN, Scripted, hook_request_bytes

frames = scriptedserver.frames  # the fixture, here for pytest to find


def _pod(name: str) -> bytes:
    return hookapi.PodSandboxHookRequest(pod_meta=hookapi.PodSandboxMetadata(name=name)).SerializeToString()


async def _outcome(transport: FramesTransport, server: Scripted, method: str, body: bytes, timeout: float) -> str:
    try:
        raw = await transport.call(server.socket_path, method, body, timeout)
    except CallFailed as err:
        return err.code.name
    if method == PRE_RUN.full_method:
        return "pod " + hookapi.PodSandboxHookResponse.FromString(raw).labels["pod"]
    return "container " + hookapi.ContainerResourceHookResponse.FromString(raw).container_annotations["n"]


async def test_calls_on_one_connection_each_take_their_own_headers(frames: Scripted) -> None:
    transport = FramesTransport()
    unknown = "/runtime.hooks.v1alpha1.RuntimeHookService/NoSuchHook"
    calls = [
        (PRE_RUN.full_method, _pod("a"), 2.0, "pod a"),
        (PRE_RUN.full_method, _pod("b"), 2.0, "pod b"),  # the same block again
        (PRE_CREATE.full_method, hook_request_bytes("7"), 2.0, "container 7"),
        (PRE_RUN.full_method, _pod("c"), 2.0, "pod c"),  # back to the first block
        (unknown, _pod("d"), 2.0, grpc.StatusCode.UNIMPLEMENTED.name),
        (PRE_CREATE.full_method, hook_request_bytes("wait"), 0.2, grpc.StatusCode.DEADLINE_EXCEEDED.name),
        (PRE_CREATE.full_method, hook_request_bytes("8"), 2.0, "container 8"),  # a longer timeout again
    ]
    try:
        seen = [await _outcome(transport, frames, method, body, timeout) for method, body, timeout, _ in calls]
    finally:
        await transport.close(1.0)
    assert seen == [expected for *_, expected in calls]

