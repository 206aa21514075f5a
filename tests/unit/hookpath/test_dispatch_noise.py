"""Issue 11 hole 7: failing hook servers say so once, without grpc's noise.

(a) an undecodable answer is one line of ours, no grpc ERROR or traceback;
(b) an Ignore hook server that is down logs one line per outage, repeats are
    summarised every minute (injected clock: no sleeping), recovery is one line.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message
from grpc import aio

from cri_api.hookapi import api_pb2 as hookapi
from hooks.sdk import HookAbort, HookServer
from runtimeproxy.hookclient.transport import transport_for
from runtimeproxy.hookpath.dispatch import Dispatcher, HookError
from runtimeproxy.hookpath.hookfile import FailurePolicy, HookServerConfig
from runtimeproxy.outages import OutageLog
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.host.unixsocket import grpc_address
from runtimeproxy.metrics import Metrics
from tests.loghandling import handled

from .dispatchfakes import Chain

HOOK = HookType.PRE_CREATE_CONTAINER
LOGGER = "runtimeproxy.hookpath.dispatch"


async def build() -> hookapi.ContainerResourceHookRequest:
    return hookapi.ContainerResourceHookRequest()


def config(name: str, endpoint: Path, policy: FailurePolicy = FailurePolicy.IGNORE) -> HookServerConfig:
    return HookServerConfig(name, str(endpoint), policy, frozenset({HOOK}), timeout=2.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _any_method_server(socket: Path, handler: grpc.RpcMethodHandler) -> aio.Server:
    """A started grpc server on ``socket`` answering every method with ``handler``."""

    class AnyMethod(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
            return handler

    server = aio.server()
    server.add_generic_rpc_handlers((AnyMethod(),))
    server.add_insecure_port(grpc_address(socket))
    await server.start()
    return server


# --------------------------------------------------------------------------- (a)


@pytest.mark.parametrize("policy", [FailurePolicy.FAIL, FailurePolicy.IGNORE])
async def test_undecodable_answer_is_one_line_of_ours_without_grpc_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, policy: FailurePolicy
) -> None:
    caplog.set_level(logging.DEBUG)
    socket = tmp_path / "garbage.sock"

    async def answer(request: bytes, context: aio.ServicerContext) -> bytes:
        return b"\xff\xff\xff"  # no ContainerResourceHookResponse

    server = await _any_method_server(socket, grpc.unary_unary_rpc_method_handler(answer))
    metrics = Metrics()
    dispatcher = Dispatcher(Chain(config("garbage.json", socket, policy)), metrics)  # type: ignore[arg-type]
    try:
        if policy is FailurePolicy.FAIL:
            with pytest.raises(HookError) as err:
                await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {})
            assert "not a valid ContainerResourceHookResponse" in err.value.cause
        else:
            assert await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {}) is False
    finally:
        await dispatcher.close()
        await server.stop(0)
    assert metrics.registry.get_sample_value(
        "runtime_proxy_hook_calls_total", {"server": "garbage.json", "hook": HOOK.value, "outcome": "invalid_answer"}
    ) == 1
    assert [r for r in caplog.records if r.name.startswith("grpc") and r.levelno >= logging.WARNING] == []
    assert [r for r in caplog.records if r.exc_info] == []
    # The hook path's lines (the loop is shared with other tests' leftovers,
    # which may log on their own while this runs).
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    ours = [r for r in warned if r.name.startswith(("runtimeproxy.hookpath", "grpc"))]
    assert len(ours) == 1, [(r.name, r.getMessage(), r.__dict__.get("error")) for r in warned]
    assert ours[0].name == LOGGER and "not a valid" in ours[0].error  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- (b)


class Flaky(HookServer):
    """Up, but failing every call until it is ``healthy``."""

    healthy = False

    async def handle(self, hook: HookType, request: Message) -> Message | None:
        if not self.healthy:
            raise HookAbort(grpc.StatusCode.UNAVAILABLE, "warming up")
        return None


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


async def test_many_missing_ignore_hooks_log_one_line_each_per_outage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """1,000 Ignore hooks whose sockets are missing logged 1,000 lines per CRI call."""
    servers = [config(f"h{i:02}.json", tmp_path / f"h{i:02}.sock") for i in range(30)]
    dispatcher = Dispatcher(Chain(*servers))  # type: ignore[arg-type]
    try:
        for _ in range(3):
            assert await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {}) is False
            await dispatcher.run_post(HOOK, hookapi.ContainerResourceHookRequest(), {})
    finally:
        await dispatcher.close()
    lines = warnings_of(caplog)
    assert len(lines) == 30, "one line per server for the whole outage"
    assert {r.hook_file for r in lines} == {s.name for s in servers}  # type: ignore[attr-defined]
    assert all("UNAVAILABLE" in r.getMessage() for r in lines)


async def test_an_outage_is_summarised_every_minute_and_its_end_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()

    async with Flaky(tmp_path / "flaky.sock") as server:
        dispatcher = Dispatcher(Chain(config("flaky.json", tmp_path / "flaky.sock")), clock=clock)  # type: ignore[arg-type]
        try:
            for _ in range(4):
                await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {})
                clock.now += 10
            assert len(warnings_of(caplog)) == 1
            clock.now += 30  # 70 s since the first failure
            await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {})
            summary = warnings_of(caplog)[-1]
            assert summary.getMessage() == "hook server flaky.json still failing: 4 failures in the last 70s"
            assert summary.hook_failures == 4  # type: ignore[attr-defined]
            await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {})
            assert len(warnings_of(caplog)) == 2  # the next window has just begun

            server.healthy = True
            clock.now += 5
            await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {"method": "CreateContainer"})
            await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {"method": "CreateContainer"})
        finally:
            await dispatcher.close()
    recovered = [r for r in caplog.records if "recovered" in r.getMessage()]
    assert len(recovered) == 1
    assert recovered[0].getMessage() == "hook server flaky.json recovered after 75.0s and 6 failed calls"
    # With the call's fields and the server's, as every line about a hook call.
    assert (recovered[0].method, recovered[0].hook_file) == ("CreateContainer", "flaky.json")  # type: ignore[attr-defined]


async def test_a_post_hooks_outage_ends_with_one_line_with_the_calls_fields(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    post = HookType.POST_START_CONTAINER
    answers = [HookAbort(grpc.StatusCode.UNAVAILABLE, "warming up"), None, None]

    class Scripted(HookServer):  # its answers in turn
        async def handle(self, hook: HookType, request: Message) -> Message | None:
            answer = answers.pop(0)
            if answer is not None:
                raise answer
            return None

    async with Scripted(tmp_path / "post.sock"):
        registered = HookServerConfig("post.json", str(tmp_path / "post.sock"), FailurePolicy.IGNORE, frozenset({post}),
                                      timeout=2.0)
        dispatcher = Dispatcher(Chain(registered), clock=FakeClock())  # type: ignore[arg-type]
        try:
            for _ in range(3):
                await dispatcher.run_post(post, hookapi.ContainerResourceHookRequest(), {"method": "StartContainer"})
        finally:
            await dispatcher.close()
    failed = warnings_of(caplog)
    recovered = [r for r in caplog.records if "recovered" in r.getMessage()]
    assert [r.getMessage() for r in failed] == ["post hook failed: UNAVAILABLE: warming up"]
    assert len(recovered) == 1 and answers == []
    for record in (failed[0], recovered[0]):
        assert (record.method, record.hook_file) == ("StartContainer", "post.json")  # type: ignore[attr-defined]


def test_outage_log_keeps_one_state_per_server_and_forgets_removed_ones() -> None:
    records: list[logging.LogRecord] = []
    with handled("test.outages", logging.INFO, records.append):
        clock = FakeClock()
        outages = OutageLog(logging.getLogger("test.outages"), clock=clock)
        for _ in range(3):
            outages.failed("a.json", logging.WARNING, "a down", {})
            outages.failed("b.json", logging.WARNING, "b down", {})
        assert [r.getMessage() for r in records] == ["a down", "b down"]
        assert outages.failing() == {"a.json", "b.json"}
        outages.keep_only({"a.json"})
        outages.failed("b.json", logging.WARNING, "b down again", {})  # re-registered: a new outage
        outages.succeeded("a.json", {})
        outages.succeeded("a.json", {})
        assert [r.getMessage() for r in records][2:] == [
            "b down again", "hook server a.json recovered after 0.0s and 3 failed calls"
        ]


async def test_a_fail_hooks_outage_ends_in_one_line_counting_every_refused_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each refusal of a Fail hook is logged (kubelet sees it); its recovery
    was not, or counted only the post hooks' failures ("after 13.1s and 6
    failed calls" after 21 refused calls), as the refusals started no outage."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()

    async with Flaky(tmp_path / "flaky.sock") as server:
        servers = Chain(config("flaky.json", tmp_path / "flaky.sock", FailurePolicy.FAIL))
        dispatcher = Dispatcher(servers, clock=clock)  # type: ignore[arg-type]
        try:
            for _ in range(3):
                with pytest.raises(HookError):
                    await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {})
                clock.now += 10
            await dispatcher.run_post(HOOK, hookapi.ContainerResourceHookRequest(), {})  # logged: not a refusal
            server.healthy = True
            await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {})
            await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {})
        finally:
            await dispatcher.close()
    refused = [r for r in caplog.records if r.getMessage() == "hook failed, refusing call"]
    assert len(refused) == 3
    recovered = [r for r in caplog.records if "recovered" in r.getMessage()]
    assert [r.getMessage() for r in recovered] == ["hook server flaky.json recovered after 30.0s and 4 failed calls"]
    assert recovered[0].hook_failures == 4  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("transport", "messages"),
    # grpc.aio's client waits out its deadline on a second message (grpc core's doing, not ours).
    [("frames", 0), ("frames", 2), ("grpc", 0)],
    ids=["frames-no-message", "frames-two-messages", "grpc-no-message"],
)
async def test_an_ok_answer_without_one_message_is_invalid_answer_on_both_transports(
    tmp_path: Path, transport: str, messages: int
) -> None:
    socket = tmp_path / "empty.sock"

    async def answer(request: bytes, context: aio.ServicerContext):  # type: ignore[no-untyped-def]
        for _ in range(messages):  # a streaming handler behind a unary method: OK, with this many messages
            yield hookapi.ContainerResourceHookResponse().SerializeToString()

    server = await _any_method_server(socket, grpc.unary_stream_rpc_method_handler(answer))
    metrics = Metrics()
    dispatcher = Dispatcher(
        Chain(config("empty.json", socket, FailurePolicy.FAIL)), metrics,  # type: ignore[arg-type]
        transport=transport_for(transport),
    )
    try:
        with pytest.raises(HookError) as err:
            await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {})
    finally:
        await dispatcher.close()
        await server.stop(0)
    assert err.value.cause.startswith("hook server answered OK with"), err.value.cause
    assert metrics.registry.get_sample_value(
        "runtime_proxy_hook_calls_total", {"server": "empty.json", "hook": HOOK.value, "outcome": "invalid_answer"}
    ) == 1
