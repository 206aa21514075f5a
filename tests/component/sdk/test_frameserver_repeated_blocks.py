"""A frames connection reads what each call needs from its header block
(route, grpc-timeout, grpc-encoding, whether it is gRPC at all) once per
distinct block, however the blocks alternate: the proxy's hook client sends
the same stateless block for every call of one method and timeout, and a
lifecycle's calls alternate methods. Calls whose blocks repeat, alternate
and change on one connection are each routed and timed by their own
headers."""

from __future__ import annotations

import grpc
import pytest

from cri_api.hookapi import api_pb2 as hookapi
from hooks.frameserver import connection
from runtimeproxy.hookclient.pool import FramesTransport
from runtimeproxy.hookclient.transport import CallFailed

from . import scriptedserver
from .scriptedserver import PRE_CREATE, PRE_RUN, Scripted, hook_request_bytes

UNKNOWN = "/runtime.hooks.v1alpha1.RuntimeHookService/NoSuchHook"

frames = scriptedserver.frames  # the fixture, here for pytest to find


def _pod(name: str) -> bytes:
    return hookapi.PodSandboxHookRequest(pod_meta=hookapi.PodSandboxMetadata(name=name)).SerializeToString()


async def _outcome(transport: FramesTransport, server: Scripted, method: str, body: bytes, timeout: float) -> str:
    try:
        raw = await transport.call(server.socket_path, method, body, timeout, owner_uid=None)
    except CallFailed as err:
        return err.code.name
    if method == PRE_RUN.full_method:
        return "pod " + hookapi.PodSandboxHookResponse.FromString(raw).labels["pod"]
    return "container " + hookapi.ContainerResourceHookResponse.FromString(raw).container_annotations["n"]


async def test_calls_on_one_connection_each_take_their_own_headers(frames: Scripted) -> None:
    """Guards existing behaviour."""
    calls = [
        (PRE_RUN.full_method, _pod("a"), 2.0, "pod a"),
        (PRE_RUN.full_method, _pod("b"), 2.0, "pod b"),  # the same block again
        (PRE_CREATE.full_method, hook_request_bytes("7"), 2.0, "container 7"),
        (PRE_RUN.full_method, _pod("c"), 2.0, "pod c"),  # back to the first block
        (UNKNOWN, _pod("d"), 2.0, grpc.StatusCode.UNIMPLEMENTED.name),
        (PRE_CREATE.full_method, hook_request_bytes("wait"), 0.2, grpc.StatusCode.DEADLINE_EXCEEDED.name),
        (PRE_CREATE.full_method, hook_request_bytes("8"), 2.0, "container 8"),  # a longer timeout again
    ]
    assert await _outcomes(frames, calls) == [expected for *_, expected in calls]


async def _outcomes(server: Scripted, calls: list[tuple[str, bytes, float, str]]) -> list[str]:
    """Each call's outcome, one after the other on one connection."""
    transport = FramesTransport()
    try:
        return [await _outcome(transport, server, method, body, timeout) for method, body, timeout, _ in calls]
    finally:
        await transport.close(1.0)


async def test_a_call_after_a_shorter_timeouts_call_of_its_method_has_its_own_deadline(frames: Scripted) -> None:
    """The second call's handler takes 0.5 s, within its 2 s: a server that
    took the first call's 0.2 s for it (the same method, a block differing
    only in grpc-timeout) would end it DEADLINE_EXCEEDED. Guards existing
    behaviour."""
    calls = [
        (PRE_CREATE.full_method, hook_request_bytes("wait"), 0.2, grpc.StatusCode.DEADLINE_EXCEEDED.name),
        (PRE_CREATE.full_method, hook_request_bytes("slow"), 2.0, "container slow"),
    ]
    assert await _outcomes(frames, calls) == [expected for *_, expected in calls]


async def test_alternating_blocks_are_each_worked_out_once(frames: Scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lifecycle's hook calls alternate methods on one connection: what a
    call takes from its block (route, timeout, encoding, refusal) is worked
    out once per distinct block, not again whenever the block before differed
    (before: a single-entry memory, which a lifecycle's calls missed every time)."""
    worked_out: list[bytes] = []
    real = connection.request_head

    def counted(headers: dict[bytes, bytes], routes: object) -> object:
        worked_out.append(headers[b":path"])
        return real(headers, routes)  # type: ignore[arg-type]

    monkeypatch.setattr(connection, "request_head", counted)
    calls = [(PRE_RUN.full_method, _pod(str(i)), 2.0, f"pod {i}") if i % 2 else
             (PRE_CREATE.full_method, hook_request_bytes(str(i)), 2.0, f"container {i}") for i in range(6)]
    assert await _outcomes(frames, calls) == [expected for *_, expected in calls]
    assert sorted(worked_out) == sorted({method.encode() for method, *_ in calls})

