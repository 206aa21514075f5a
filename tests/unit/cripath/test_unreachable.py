"""cripath/unreachable.py over scripted channel states: what a hooked call's
wait for the runtime's connection comes to, and how it is refused."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest

from runtimeproxy.cripath.unreachable import NO_DEADLINE_WAIT_S, Reach, RuntimeGate, connects, refused
from runtimeproxy.cripath.unready import Unready

S = grpc.ChannelConnectivity
SOCKET = Path("/run/containerd/containerd.sock")


class Channel:
    """Each state change it is waited for moves it to the next of ``after``
    (none left: it never changes again); connecting an idle one makes it
    CONNECTING, as grpc's does."""

    def __init__(self, state: grpc.ChannelConnectivity, after: list[grpc.ChannelConnectivity]) -> None:
        self.state = state
        self.after = after
        self.never = asyncio.Event()

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        if try_to_connect and self.state is S.IDLE:
            self.state = S.CONNECTING
        return self.state

    async def wait_for_state_change(self, last: grpc.ChannelConnectivity) -> None:
        if not self.after:
            await self.never.wait()
        await asyncio.sleep(0)  # a change is reported in a later loop turn
        self.state = self.after.pop(0)


class Flapping(Channel):
    """Its connections drop as they are made: each change read is IDLE, then
    CONNECTING again once connected, for ever."""

    def __init__(self) -> None:
        super().__init__(S.CONNECTING, [])

    async def wait_for_state_change(self, last: grpc.ChannelConnectivity) -> None:
        await asyncio.sleep(0)
        self.state = S.IDLE  # it was READY, and dropped, before this read


async def test_an_idle_channel_is_connected_and_its_call_goes_on_once_ready() -> None:
    channel = Channel(S.IDLE, [S.READY])
    assert await connects(channel, S.IDLE, 1.0) is Reach.READY  # type: ignore[arg-type]
    assert refused(Reach.READY, SOCKET, deadline=True) is None


async def test_a_failed_attempt_is_refused_unavailable() -> None:
    channel = Channel(S.CONNECTING, [S.TRANSIENT_FAILURE])
    reach = await connects(channel, S.CONNECTING, 1.0)  # type: ignore[arg-type]
    assert reach is Reach.FAILED
    refusal = refused(reach, SOCKET, deadline=True)
    assert refusal is not None and refusal.code is grpc.StatusCode.UNAVAILABLE
    assert "not reachable" in refusal.message and "no hook server was asked" in refusal.message


async def test_transient_failure_and_shutdown_are_refused_at_once() -> None:
    for state in (S.TRANSIENT_FAILURE, S.SHUTDOWN):
        channel = Channel(state, [])
        assert await asyncio.wait_for(connects(channel, state, None), 1) is Reach.FAILED  # type: ignore[arg-type]


async def test_a_connection_still_being_made_at_the_deadline_ends_the_call_deadline_exceeded() -> None:
    """Not UNAVAILABLE with "its connection failed": it has not failed, and the
    call would have ended at its deadline at the runtime too."""
    channel = Channel(S.CONNECTING, [])
    reach = await connects(channel, S.CONNECTING, 0.05)  # type: ignore[arg-type]
    assert reach is Reach.PENDING
    refusal = refused(reach, SOCKET, deadline=True)
    assert refusal is not None and refusal.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert refusal.message == (
        f"runtime-proxy: the connection to the runtime at {SOCKET} was still being made at the call's deadline; "
        "the call was not sent and no hook server was asked"
    )
    assert "failed" not in refusal.message


async def test_with_no_deadline_a_runtime_whose_connections_drop_as_made_is_waited_for_only_up_to_the_cap() -> None:
    reach = await asyncio.wait_for(connects(Flapping(), S.CONNECTING, None, cap=0.05), 5)  # type: ignore[arg-type]
    assert reach is Reach.PENDING
    refusal = refused(reach, SOCKET, deadline=False)
    assert refusal is not None and refusal.code is grpc.StatusCode.UNAVAILABLE
    assert f"not up within {NO_DEADLINE_WAIT_S:g} s (the call has no deadline)" in refusal.message



class Aborted(Exception):
    pass


class Context:
    """A grpc servicer context's deadline and abort, as the gate uses them."""

    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def time_remaining(self) -> float:
        return 5.0

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        self.aborted = (code, message)
        raise Aborted


async def test_a_refusal_between_pre_hooks_says_why_the_runtime_does_not_serve(caplog: pytest.LogCaptureFixture) -> None:
    """Its info line names the runtime's reason (before: always 'the runtime was lost')."""
    unready = Unready(SOCKET)  # nothing asks the runtime here
    unready.saw("it answers 'server is not initialized yet'")
    gate = RuntimeGate(Channel(S.READY, []), SOCKET, "/runtime.v1.RuntimeService/RunPodSandbox", unready)  # type: ignore[arg-type]
    context = Context()
    caplog.set_level(logging.INFO, "runtimeproxy.cripath.unreachable")
    with pytest.raises(Aborted):
        await gate.enter(context, between_hooks=True)  # type: ignore[arg-type]
    assert context.aborted is not None and context.aborted[0] == grpc.StatusCode.UNAVAILABLE
    assert "no later hook server of its chain was asked" in context.aborted[1]
    [line] = [r for r in caplog.records if r.levelno == logging.INFO]
    assert vars(line)["reason"] == "it answers 'server is not initialized yet'"
    assert "lost or stopped serving" in line.getMessage()


async def test_a_refusal_between_pre_hooks_for_the_connection_does_not_name_unreadys_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The connection failed while Unready also holds a reason: the line says
    the connection, the refusal's cause (before: Unready's reason, though the
    refusal was not for it)."""
    unready = Unready(SOCKET)
    unready.saw("it answers 'server is not initialized yet'")
    gate = RuntimeGate(Channel(S.TRANSIENT_FAILURE, []), SOCKET, "/runtime.v1.RuntimeService/RunPodSandbox",  # type: ignore[arg-type]
                       unready)
    context = Context()
    caplog.set_level(logging.INFO, "runtimeproxy.cripath.unreachable")
    with pytest.raises(Aborted):
        await gate.enter(context, between_hooks=True)  # type: ignore[arg-type]
    assert context.aborted is not None and context.aborted[0] == grpc.StatusCode.UNAVAILABLE
    assert "is not reachable" in context.aborted[1]
    assert context.aborted[1].endswith("the call was not sent and no later hook server of its chain was asked")
    [line] = [r for r in caplog.records if r.levelno == logging.INFO]
    assert vars(line)["reason"] == "its connection is not up"
    assert vars(line)["error"] == "the runtime is not reachable: refused between its pre hooks"


@pytest.mark.parametrize("reach", [Reach.FAILED, Reach.PENDING])
@pytest.mark.parametrize("deadline", [True, False])
def test_every_refusal_says_whether_some_hooks_were_asked(reach: Reach, deadline: bool) -> None:
    before = refused(reach, SOCKET, deadline=deadline)
    between = refused(reach, SOCKET, deadline=deadline, asked_some=True)
    assert before is not None and between is not None
    assert before.message.endswith("no hook server was asked") and before.error.endswith("refused before its hooks")
    assert between.message.endswith("no later hook server of its chain was asked")
    assert between.error.endswith("refused between its pre hooks")
    unready = Unready(SOCKET)
    unready.saw("it was lost")
    assert unready.refusal_text().endswith("no hook server was asked")
    assert unready.refusal_text(asked_some=True).endswith("no later hook server of its chain was asked")
