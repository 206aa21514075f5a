"""Dispatcher edge cases that need no hook-server process."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import grpc
import pytest
from google.protobuf.message import Message

from cri_api.hookapi import api_pb2 as hookapi
from hooks.sdk import HookServer
from runtimeproxy.hookclient.transport import CallFailed, transport_for
from runtimeproxy.hookpath.dispatch import Dispatcher, HookError, Unbuilt
from runtimeproxy.hookpath.hookfile import FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType, Kind
from runtimeproxy.hookpath.registry import HookSnapshot
from tests.hookrequests import request_for

from .dispatchfakes import Chain, NoConnections

HOOK = HookType.PRE_CREATE_CONTAINER


class OneServer:
    """A registry holding one hook server, whatever its file said."""

    def __init__(self, server: HookServerConfig) -> None:
        self.server = server

    @property
    def snapshot(self) -> HookSnapshot:
        return HookSnapshot({self.server.name: self.server})

    def servers_for(self, hook: HookType) -> tuple[HookServerConfig, ...]:
        return (self.server,) if hook in self.server.hooks else ()

    def on_change(self, callback: Callable[[HookSnapshot], None]) -> None:
        pass


def server(policy: FailurePolicy) -> HookServerConfig:
    return HookServerConfig("odd.json", "/run/odd.sock", policy, frozenset({HOOK}), timeout=1.0)


class BrokenTransport(NoConnections):
    """A transport that fails in a way no hook call should (a bug, a library's surprise)."""

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        raise UnicodeEncodeError("utf-8", endpoint, 5, 6, "surrogates not allowed")


async def build() -> hookapi.ContainerResourceHookRequest:
    return hookapi.ContainerResourceHookRequest()


class OwnerRecording(NoConnections):
    """Answers every call, keeping the hook file owner it was called for."""

    def __init__(self) -> None:
        self.owners: list[int | None] = []

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        self.owners.append(owner_uid)
        return hookapi.ContainerResourceHookResponse().SerializeToString()


async def test_the_hook_files_owner_is_what_the_transport_judges_the_socket_for() -> None:
    """The file's owner reaches the transport, which judges the socket for it
    (a file owned by uid 1000 may call a socket uid 1000 owns; one that is
    root's may not)."""
    transport = OwnerRecording()
    owned = dataclasses.replace(server(FailurePolicy.FAIL), owner_uid=1000)
    dispatcher = Dispatcher(OneServer(owned), transport=transport)  # type: ignore[arg-type]
    assert await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {}) is True
    assert transport.owners == [1000]
    await dispatcher.close()


async def test_unexpected_error_is_the_hooks_failure_under_fail() -> None:
    dispatcher = Dispatcher(OneServer(server(FailurePolicy.FAIL)), transport=BrokenTransport())  # type: ignore[arg-type]
    with pytest.raises(HookError) as excinfo:
        await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {})
    assert "UnicodeEncodeError" in excinfo.value.cause
    assert "odd.json" in str(excinfo.value)
    await dispatcher.close()


async def test_unexpected_error_is_skipped_under_ignore() -> None:
    dispatcher = Dispatcher(OneServer(server(FailurePolicy.IGNORE)), transport=BrokenTransport())  # type: ignore[arg-type]
    assert await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {}) is False
    await dispatcher.close()


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_every_hook_point_is_called_with_its_rpc_and_classes(
    tmp_path_factory: pytest.TempPathFactory, transport: str
) -> None:
    """The dispatcher calls each hook point's RPC with its request class and
    decodes its response class (an in-process SDK server records what came)."""
    seen: list[tuple[HookType, type]] = []

    class Recording(HookServer):
        async def handle(self, hook: HookType, request: Message) -> Message | None:
            seen.append((hook, type(request)))
            answer = HOOK_POINTS[hook].response_type()
            getattr(answer, "labels" if HOOK_POINTS[hook].kind is Kind.POD else "container_annotations")["hook"] = hook.value
            return answer

    path = tmp_path_factory.mktemp("d", numbered=True) / "h.sock"
    async with Recording(path):
        config = HookServerConfig("h.json", str(path), FailurePolicy.FAIL, frozenset(HookType))
        dispatcher = Dispatcher(OneServer(config), transport=transport_for(transport))  # type: ignore[arg-type]
        try:
            for hook, point in HOOK_POINTS.items():
                answer = await dispatcher.call(dispatcher.servers(hook)[0], hook, request_for(hook))
                assert type(answer) is point.response_type
                got = answer.labels if point.kind is Kind.POD else answer.container_annotations
                assert got == {"hook": hook.value}
        finally:
            await dispatcher.close()
    assert seen == [(hook, point.request_type) for hook, point in HOOK_POINTS.items()]


async def _splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_a_slow_handshake_is_bounded_by_the_hook_timeout_not_by_grpc(
    tmp_path_factory: pytest.TempPathFactory, transport: str
) -> None:
    """A hook server that sends its first SETTINGS frame late (a busy node, a
    server starting up) is still called: connecting is part of the hook call,
    bounded by the hook's own timeout (grpc's own connect deadline was 0.1 s)."""
    directory = tmp_path_factory.mktemp("slow", numbered=True)
    real, slow = directory / "real.sock", directory / "slow.sock"
    delay = 0.4  # well over grpc's old 0.1 s, well under the 5 s hook timeout

    async def late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(delay)  # the handshake delay under test, not a wait for an event
        up_reader, up_writer = await asyncio.open_unix_connection(str(real))
        await asyncio.gather(_splice(reader, up_writer), _splice(up_reader, writer))

    relay = await asyncio.start_unix_server(late, path=str(slow))
    async with HookServer(real), relay:
        server = HookServerConfig("slow.json", str(slow), FailurePolicy.FAIL, frozenset({HOOK}), timeout=5.0)
        dispatcher = Dispatcher(OneServer(server), transport=transport_for(transport))  # type: ignore[arg-type]
        try:
            answer = await dispatcher.call(server, HOOK, request_for(HOOK))
            assert type(answer) is hookapi.ContainerResourceHookResponse
        finally:
            await dispatcher.close()


class Answering(NoConnections):
    """Answers every call with ``answer``; runs ``on_call`` with the endpoint first."""

    def __init__(self, answer: Message, on_call: Callable[[str], None] = lambda endpoint: None) -> None:
        self.answer, self.on_call, self.called = answer, on_call, []

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        self.called.append(endpoint)
        self.on_call(endpoint)
        return self.answer.SerializeToString()


def named(name: str, policy: FailurePolicy, *hooks: HookType) -> HookServerConfig:
    return HookServerConfig(f"{name}.json", f"/run/{name}.sock", policy, frozenset(hooks or {HOOK}), timeout=1.0)


@pytest.mark.parametrize("phase", ["pre", "post"])
async def test_a_server_removed_while_the_chain_runs_is_not_called(phase: str) -> None:
    """An operator removes a Fail server's file while an earlier hook answers:
    the call goes on without it, not refused for a server taken out."""
    hook = HOOK if phase == "pre" else HookType.POST_START_CONTAINER
    first, second = named("first", FailurePolicy.IGNORE, hook), named("second", FailurePolicy.FAIL, hook)
    registry = Chain(first, second)
    transport = Answering(hookapi.ContainerResourceHookResponse(), lambda endpoint: registry.servers.remove(second))
    dispatcher = Dispatcher(registry, transport=transport)  # type: ignore[arg-type]
    if phase == "pre":
        assert await dispatcher.run_pre(hook, build, lambda answer, server: False, {}) is False
    else:
        await dispatcher.run_post(hook, hookapi.ContainerResourceHookRequest(), {})
    assert transport.called == [first.endpoint]
    await dispatcher.close()


async def unbuildable() -> None:
    raise Unbuilt("ctr-1")


async def absent() -> None:
    return None  # the runtime said it has no such container: its to refuse


@pytest.mark.parametrize("policy", [FailurePolicy.FAIL, FailurePolicy.IGNORE])
async def test_a_hook_request_that_cannot_be_built_refuses_under_fail(policy: FailurePolicy) -> None:
    """No record of the container and none read from the runtime: a Fail
    server is not bypassed (the call is refused, as if it had not answered)."""
    transport = Answering(hookapi.ContainerResourceHookResponse())
    dispatcher = Dispatcher(Chain(named("lax", FailurePolicy.IGNORE), named("strict", policy)), transport=transport)  # type: ignore[arg-type]
    if policy is FailurePolicy.FAIL:
        with pytest.raises(HookError) as refused:
            await dispatcher.run_pre(HOOK, unbuildable, lambda answer, server: False, {})
        assert refused.value.server.name == "strict.json" and "could not read it from the runtime" in str(refused.value)
    else:
        assert await dispatcher.run_pre(HOOK, unbuildable, lambda answer, server: False, {}) is False
    assert await dispatcher.run_pre(HOOK, absent, lambda answer, server: False, {}) is False
    assert transport.called == []
    await dispatcher.close()


async def test_a_pre_start_answer_is_not_judged_by_the_kernels_rules_since_it_is_never_applied() -> None:
    from runtimeproxy.hookpath.dispatch import _Failure
    from runtimeproxy.hookpath.nodefacts import NodeFactsSource
    from runtimeproxy.hookpath.validate import NodeFacts

    absurd = hookapi.ContainerResourceHookResponse(container_resources=hookapi.LinuxContainerResources(cpuset_cpus="0-511"))
    start, create = HookType.PRE_START_CONTAINER, HookType.PRE_CREATE_CONTAINER
    dispatcher = Dispatcher(
        Chain(named("s", FailurePolicy.FAIL, start, create)), transport=Answering(absurd),  # type: ignore[arg-type]
        node=NodeFactsSource(lambda: NodeFacts(online_cpus=frozenset(range(8)), memory_nodes=frozenset({0}))),
    )
    [server] = dispatcher.servers(start)
    assert await dispatcher.call(server, start, request_for(start)) == absurd
    with pytest.raises(_Failure, match="cpuset_cpus"):
        await dispatcher.call(server, create, request_for(create))
    await dispatcher.close()


class RemovedWhileCalled(Answering):
    """The server's file is removed while its call is under way: the call fails as the transport fails it."""

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        self.called.append(endpoint)
        self.on_call(endpoint)
        raise CallFailed(grpc.StatusCode.CANCELLED, "hook server was removed while the call was under way")


async def test_a_fail_server_removed_while_it_is_called_does_not_refuse_the_call() -> None:
    strict = named("strict", FailurePolicy.FAIL)
    registry = Chain(strict)
    transport = RemovedWhileCalled(hookapi.ContainerResourceHookResponse(), lambda endpoint: registry.servers.clear())
    dispatcher = Dispatcher(registry, transport=transport)  # type: ignore[arg-type]
    assert await dispatcher.run_pre(HOOK, build, lambda answer, server: False, {}) is False
    assert transport.called == [strict.endpoint]
    registry.servers.append(strict)  # still registered: its failure refuses the call
    transport.on_call = lambda endpoint: None
    with pytest.raises(HookError):
        await dispatcher.run_pre(HOOK, build, lambda answer, server: False, {})
    await dispatcher.close()


async def test_a_removed_servers_stats_are_forgotten() -> None:
    """A file removed and added again under its name starts with no last error."""
    from runtimeproxy.metrics import Metrics

    changed: list[Callable[[HookSnapshot], None]] = []

    class Watched(Chain):
        def on_change(self, callback: Callable[[HookSnapshot], None]) -> None:
            changed.append(callback)

    metrics = Metrics()
    kept = named("kept", FailurePolicy.IGNORE)
    dispatcher = Dispatcher(Watched(kept), metrics, transport=Answering(hookapi.ContainerResourceHookResponse()))  # type: ignore[arg-type]
    metrics.hook_call("kept.json", HOOK.value, "ok", 0.001)
    metrics.hook_call("gone.json", HOOK.value, "unavailable", 0.001)
    changed[0](HookSnapshot(servers={"kept.json": kept}))
    assert set(metrics.hook_stats) == {"kept.json"}
    await dispatcher.close()


async def test_a_fail_server_removed_while_the_request_is_read_back_does_not_refuse() -> None:
    strict = named("strict", FailurePolicy.FAIL)
    registry = Chain(strict)
    dispatcher = Dispatcher(registry, transport=Answering(hookapi.ContainerResourceHookResponse()))  # type: ignore[arg-type]

    async def read_back_fails_meanwhile() -> None:
        registry.servers.remove(strict)  # its file removed while the runtime is read
        raise Unbuilt("ctr-1")

    assert await dispatcher.run_pre(HOOK, read_back_fails_meanwhile, lambda answer, server: False, {}) is False
    await dispatcher.close()


class Live(Chain):
    """A registry that tells the dispatcher of each removal, as the real one does."""

    def __init__(self, *servers: HookServerConfig) -> None:
        super().__init__(*servers)
        self.callbacks: list[Callable[[HookSnapshot], None]] = []

    def on_change(self, callback: Callable[[HookSnapshot], None]) -> None:
        self.callbacks.append(callback)

    def remove(self, server: HookServerConfig) -> None:
        self.servers.remove(server)
        for callback in self.callbacks:
            callback(HookSnapshot(servers={s.name: s for s in self.servers}))


class Hanging(Answering):
    """A server that never answers; ``started`` is set once a call reached it."""

    def __init__(self) -> None:
        super().__init__(hookapi.ContainerResourceHookResponse())
        self.started = asyncio.Event()

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        self.started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_call_that_outlives_its_files_removal_leaves_no_stats_behind() -> None:
    from runtimeproxy.metrics import Metrics

    server = named("slow", FailurePolicy.IGNORE, HookType.POST_START_CONTAINER)
    registry, metrics, transport = Live(server), Metrics(), Hanging()
    dispatcher = Dispatcher(registry, metrics, transport=transport)  # type: ignore[arg-type]
    call = asyncio.ensure_future(dispatcher.run_post(HookType.POST_START_CONTAINER, hookapi.ContainerResourceHookRequest(), {}))
    await transport.started.wait()
    registry.remove(server)
    call.cancel()  # (its connection closed after the grace: the call ends)
    with pytest.raises(asyncio.CancelledError):
        await call
    assert "slow.json" not in metrics.hook_stats
    await dispatcher.close()


async def test_a_hook_call_cancelled_with_its_caller_is_counted_cancelled() -> None:
    """NRI gives up on a late event by cancelling its stage: the hook call in
    flight is not an answer, and must not be counted as one."""
    from runtimeproxy.metrics import Metrics

    server, metrics, transport = named("slow", FailurePolicy.IGNORE), Metrics(), Hanging()
    dispatcher = Dispatcher(Chain(server), metrics, transport=transport)  # type: ignore[arg-type]
    chain = asyncio.ensure_future(dispatcher.run_pre(HOOK, build, lambda answer, server: False, {}))
    await transport.started.wait()
    chain.cancel()
    with pytest.raises(asyncio.CancelledError):
        await chain
    assert metrics.hook_stats["slow.json"].calls == {"cancelled": 1}
    # Its caller's cancel is no failure of the server's: no last error (HookServerStats).
    assert metrics.hook_stats["slow.json"].last_error is None
    await dispatcher.close()


async def test_an_answer_never_applied_that_sets_fields_is_logged_once_per_file_and_point(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: a PreStartContainer (or post hook) answer setting env went
    unapplied without a word, so its author saw the container unchanged."""
    envs = hookapi.ContainerResourceHookResponse(container_envs={"START": "1"})
    start, stop = HookType.PRE_START_CONTAINER, HookType.POST_STOP_CONTAINER
    dispatcher = Dispatcher(Chain(named("s", FailurePolicy.FAIL, start, stop)), transport=Answering(envs))  # type: ignore[arg-type]
    [server] = dispatcher.servers(start)
    caplog.set_level("INFO", logger="runtimeproxy.hookpath.dispatch")
    for _ in range(2):
        for hook in (start, stop):
            assert await dispatcher.call(server, hook, request_for(hook)) == envs
    noted = [r for r in caplog.records if r.getMessage().startswith("hook answer not applied")]
    assert [(r.getMessage(), r.hook_file, r.answer_fields) for r in noted] == [
        ("hook answer not applied: no PreStartContainer answer is (StartContainer carries nothing to change)",
         "s.json", "container_envs"),
        ("hook answer not applied: no PostStopContainer answer is (StopContainer was already answered)",
         "s.json", "container_envs"),
    ]
    # An empty answer is no attempt to change anything: nothing logged.
    caplog.clear()
    quiet = Dispatcher(Chain(named("q", FailurePolicy.FAIL, start)), transport=Answering(
        hookapi.ContainerResourceHookResponse()))  # type: ignore[arg-type]
    [server] = quiet.servers(start)
    await quiet.call(server, start, request_for(start))
    assert not [r for r in caplog.records if r.getMessage().startswith("hook answer not applied")]
    await dispatcher.close()
    await quiet.close()


async def test_an_edited_hook_file_s_unapplied_answer_is_logged_again_and_unknown_fields_alone_not_at_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: noted once per file name for the proxy's life (an edited file,
    its server perhaps changed too, never logged again), and an answer of
    unknown fields only (a newer proto's) logged with answer_fields=""."""
    start = HookType.PRE_START_CONTAINER
    envs = hookapi.ContainerResourceHookResponse(container_envs={"START": "1"})
    registry = Chain(named("s", FailurePolicy.FAIL, start))
    dispatcher = Dispatcher(registry, transport=Answering(envs))  # type: ignore[arg-type]
    [server] = dispatcher.servers(start)
    edited = dataclasses.replace(server, timeout=2.0)
    caplog.set_level("INFO", logger="runtimeproxy.hookpath.dispatch")
    for config in (server, server, edited, edited):
        registry.servers = [config]  # the file as the registry read it last
        await dispatcher.call(config, start, request_for(start))
    noted = [r for r in caplog.records if r.getMessage().startswith("hook answer not applied")]
    assert [(r.hook_file, r.answer_fields) for r in noted] == [("s.json", "container_envs")] * 2
    caplog.clear()
    unknown = hookapi.ContainerResourceHookResponse.FromString(b"\x98\x06\x01")  # field 99, varint 1
    newer = Dispatcher(Chain(named("n", FailurePolicy.FAIL, start)), transport=Answering(unknown))  # type: ignore[arg-type]
    [server] = newer.servers(start)
    await newer.call(server, start, request_for(start))
    assert not [r for r in caplog.records if r.getMessage().startswith("hook answer not applied")]
    await dispatcher.close()
    await newer.close()


async def test_an_update_answer_s_env_and_cgroup_parent_are_logged_as_not_applied(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: dropped from PreUpdateContainerResources' answer without a
    word (the update takes its annotations and resources only)."""
    update = HookType.PRE_UPDATE_CONTAINER_RESOURCES
    applied = hookapi.ContainerResourceHookResponse(container_annotations={"a": "1"})
    applied.container_resources.cpu_shares = 512
    both = hookapi.ContainerResourceHookResponse(container_envs={"E": "1"}, pod_cgroup_parent="/kubepods/x")
    both.MergeFrom(applied)
    caplog.set_level("INFO", logger="runtimeproxy.hookpath.dispatch")
    transport = Answering(applied)
    dispatcher = Dispatcher(Chain(named("u", FailurePolicy.FAIL, update)), transport=transport)  # type: ignore[arg-type]
    [server] = dispatcher.servers(update)
    for transport.answer in (applied, both, both):
        assert await dispatcher.call(server, update, request_for(update)) == transport.answer
    noted = [r for r in caplog.records if r.getMessage().startswith("hook answer not applied")]
    assert [(r.getMessage(), r.answer_fields) for r in noted] == [
        ("hook answer not applied: PreUpdateContainerResources answers' container_envs, pod_cgroup_parent are not "
         "(UpdateContainerResources carries neither env nor a cgroup parent)", "container_envs,pod_cgroup_parent"),
    ]
    await dispatcher.close()


class Refusing(NoConnections):
    """A hook server answering every call with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        raise CallFailed(self.code, self.details)


@pytest.mark.parametrize(("code", "details", "cause"), [
    (grpc.StatusCode.UNAVAILABLE, "cannot connect to /run/odd.sock: Connection refused",
     "UNAVAILABLE: cannot connect to /run/odd.sock: Connection refused"),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", "no answer within 1s"),
])
async def test_a_failures_cause_is_kept_as_the_servers_last_error(
    code: grpc.StatusCode, details: str, cause: str
) -> None:
    """`status` showed `last error: unavailable on PreCreateContainer at ...` and no word of why."""
    from runtimeproxy.metrics import Metrics

    metrics = Metrics()
    dispatcher = Dispatcher(OneServer(server(FailurePolicy.IGNORE)), metrics, transport=Refusing(code, details))  # type: ignore[arg-type]
    await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {})
    last = metrics.hook_stats["odd.json"].last_error
    assert last is not None and (last["outcome"], last["hook"], last["cause"]) == (code.name.lower(), HOOK.value, cause)
    await dispatcher.close()


async def test_a_long_cause_is_cut_in_the_last_error() -> None:
    """A hook server's details may be its whole traceback: `status` keeps a bounded part."""
    from runtimeproxy.metrics import MAX_CAUSE, Metrics

    metrics = Metrics()
    transport = Refusing(grpc.StatusCode.INTERNAL, "Traceback:\n" + "x" * 100_000)
    dispatcher = Dispatcher(OneServer(server(FailurePolicy.IGNORE)), metrics, transport=transport)  # type: ignore[arg-type]
    await dispatcher.run_pre(HOOK, build, lambda answer, server: True, {})
    cause = metrics.hook_stats["odd.json"].last_error["cause"]  # type: ignore[index]
    assert isinstance(cause, str) and cause.startswith("INTERNAL: Traceback:\nxxx") and len(cause) < MAX_CAUSE + 100
    assert cause.endswith(f"... ({len('INTERNAL: Traceback:') + 1 + 100_000} characters, cut; the proxy's log has it whole)")
    await dispatcher.close()


async def test_a_hook_request_is_built_only_for_a_server_to_be_called() -> None:
    """Each build follows the calls before it: the stage's gate check in its
    build says 'no later hook server was asked' only when one was
    (hookpath/prehooks.py). ``gone`` is removed as the chain begins.

    Before: ``gone``'s request was built, then the server skipped, so the
    next build followed no call."""
    gone, first, second = (named(n, FailurePolicy.IGNORE) for n in ("gone", "first", "second"))

    class RemovedAtStart(Chain):
        def servers_for(self, hook: HookType) -> tuple[HookServerConfig, ...]:
            listed = super().servers_for(hook)
            if gone in self.servers:
                self.servers.remove(gone)  # the chain's own list keeps it
            return listed

    transport = Answering(hookapi.ContainerResourceHookResponse())
    dispatcher = Dispatcher(RemovedAtStart(gone, first, second), transport=transport)  # type: ignore[arg-type]
    calls_before: list[int] = []

    async def counting_build() -> hookapi.ContainerResourceHookRequest:
        calls_before.append(len(transport.called))
        return await build()

    await dispatcher.run_pre(HOOK, counting_build, lambda answer, server: False, {})
    assert transport.called == [first.endpoint, second.endpoint]
    assert calls_before == [0, 1]
    await dispatcher.close()
