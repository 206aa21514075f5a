"""The hook-server SDK in process: handlers, the generic entry point, socket
safety, and registering with write_hook_config. (The test hook server as a
process is tested in tests/component/sdk/.)
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import socket
import stat
import struct
from pathlib import Path

import grpc
import pytest

from cri_api.hookapi import api_pb2, api_pb2_grpc
from hooks import routes
from hooks.sdk import (
    HookAbort,
    HookServer,
    HookServerError,
    SocketPathError,
    write_hook_config,
)
from runtimeproxy.hookpath.hookfile import FailurePolicy, parse_hook_file
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType, Kind
from runtimeproxy.hookpath.registry import HookRegistry
from tests.component.rawh2 import DATA, END_HEADERS, END_STREAM, HEADERS, RST_STREAM, frame, literal_headers, raw_with_settings
from tests.hookrequests import container_request, pod_request, request_for


# --------------------------------------------------------------------------- in-process SDK


class CpuSharesHook(HookServer):
    """Example hook server: caps cpu_shares at create, fails on update, returns a wrong type on start."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []

    async def pre_create_container(self, request):  # type: ignore[no-untyped-def]
        self.seen.append(request.container_meta.name)
        resources = api_pb2.LinuxContainerResources()
        resources.CopyFrom(request.container_resources)
        resources.cpu_shares = min(resources.cpu_shares, 512)
        return api_pb2.ContainerResourceHookResponse(container_resources=resources)

    async def pre_run_pod_sandbox(self, request):  # type: ignore[no-untyped-def]
        raise HookAbort(grpc.StatusCode.PERMISSION_DENIED, f"pod {request.pod_meta.name} not allowed")

    async def pre_update_container_resources(self, request):  # type: ignore[no-untyped-def]
        raise RuntimeError("database on fire")

    async def pre_start_container(self, request):  # type: ignore[no-untyped-def]
        return api_pb2.PodSandboxHookResponse()  # wrong response type


async def test_sdk_server_handlers_and_defaults(sock_dir: Path) -> None:
    path = sock_dir / "sdk.sock"
    async with CpuSharesHook(path) as server:
        assert server.serving and server.socket_path == str(path)
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o660
        async with grpc.aio.insecure_channel(server.target) as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            response = await stub.PreCreateContainerHook(container_request(), timeout=5)
            assert response.container_resources.cpu_shares == 512
            assert response.container_resources.memory_limit_in_bytes == 1 << 30
            assert server.seen == ["web"]

            # Unimplemented hooks answer an empty response ("no change").
            for hook in (HookType.POST_STOP_POD_SANDBOX, HookType.POST_START_CONTAINER, HookType.POST_STOP_CONTAINER):
                response = await getattr(stub, HOOK_POINTS[hook].rpc_name)(request_for(hook), timeout=5)
                assert response == HOOK_POINTS[hook].response_type()

            with pytest.raises(grpc.aio.AioRpcError) as excinfo:
                await stub.PreRunPodSandboxHook(pod_request(), timeout=5)
            assert excinfo.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert excinfo.value.details() == "pod nginx not allowed"

            with pytest.raises(grpc.aio.AioRpcError) as excinfo:
                await stub.PreUpdateContainerResourcesHook(container_request(), timeout=5)
            assert excinfo.value.code() == grpc.StatusCode.INTERNAL
            assert "database on fire" in excinfo.value.details()

            with pytest.raises(grpc.aio.AioRpcError) as excinfo:
                await stub.PreStartContainerHook(container_request(), timeout=5)
            assert excinfo.value.code() == grpc.StatusCode.INTERNAL
            assert "expected ContainerResourceHookResponse" in excinfo.value.details()
    assert not server.serving
    assert not path.exists()


async def test_sdk_generic_handle_override(sock_dir: Path) -> None:
    class Echo(HookServer):
        async def handle(self, hook, request):  # type: ignore[no-untyped-def]
            if HOOK_POINTS[hook].kind is Kind.POD:
                return api_pb2.PodSandboxHookResponse(labels={"hook": hook.value})
            return api_pb2.ContainerResourceHookResponse(container_annotations={"hook": hook.value})

    async with Echo(sock_dir / "echo.sock") as server, grpc.aio.insecure_channel(server.target) as channel:
        stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
        for hook in HookType:
            response = await getattr(stub, HOOK_POINTS[hook].rpc_name)(request_for(hook), timeout=5)
            got = response.labels if HOOK_POINTS[hook].kind is Kind.POD else response.container_annotations
            assert got == {"hook": hook.value}


async def test_sdk_socket_safety(sock_dir: Path) -> None:
    # A regular file at the socket path is never replaced.
    regular = sock_dir / "file.sock"
    regular.write_text("precious")
    with pytest.raises(HookServerError, match="not a unix socket"):
        await HookServer(regular).start()
    assert regular.read_text() == "precious"

    # A live socket is not stolen; a stale one is replaced.
    live = sock_dir / "live.sock"
    async with HookServer(live):
        with pytest.raises(HookServerError, match="in use"):
            await HookServer(live).start()
    stale_path = sock_dir / "stale.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(stale_path))
    stale.close()
    async with HookServer(stale_path, socket_mode=0o600) as server:
        assert stat.S_IMODE(os.lstat(stale_path).st_mode) == 0o600
        with pytest.raises(HookServerError, match="already started"):
            await server.start()
    assert not stale_path.exists()

    with pytest.raises(ValueError, match="too long"):
        HookServer(sock_dir / ("x" * 120 + ".sock"))


def test_sdk_a_path_with_a_comma_is_refused_before_anything_is_bound(sock_dir: Path) -> None:
    """The proxy dials it through grpc, which splits it at the comma. Before:
    bound, then refused at registration (`hook run` served a moment first)."""
    with pytest.raises(ValueError, match=r"cannot serve hooks at .*/h,k\.sock: a comma in a unix socket path"):
        HookServer(sock_dir / "h,k.sock")
    assert list(sock_dir.iterdir()) == []


async def test_sdk_a_path_nothing_can_listen_at_is_told_from_one_in_use(sock_dir: Path) -> None:
    """``hook run`` exits 2 (no restart) on the first kind, 1 on the second."""
    (sock_dir / "file").write_text("precious")
    with pytest.raises(SocketPathError, match=f"{sock_dir / 'file'} is not a directory"):
        await HookServer(sock_dir / "file" / "h.sock").start()
    with pytest.raises(SocketPathError, match="not a unix socket"):
        await HookServer(sock_dir / "file").start()
    async with HookServer(sock_dir / "live.sock"):
        with pytest.raises(HookServerError, match="in use") as in_use:
            await HookServer(sock_dir / "live.sock").start()
    assert not isinstance(in_use.value, SocketPathError)
    assert (sock_dir / "file").read_text() == "precious"


# --------------------------------------------------------------------------- write_hook_config


def test_write_hook_config_koordinator_format(tmp_path: Path) -> None:
    hook_dir = tmp_path / "hookserver.d"
    path = write_hook_config(hook_dir, "koordlet", "/var/run/koordlet/koordlet.sock", ["PreRunPodSandbox", HookType.PRE_CREATE_CONTAINER])
    assert path == hook_dir / "koordlet.json"
    assert json.loads(path.read_text()) == {
        "remote-endpoint": "/var/run/koordlet/koordlet.sock",
        "failure-policy": "Ignore",
        "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer"],
    }
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(hook_dir).st_mode) == 0o755
    assert sorted(p.name for p in hook_dir.iterdir()) == ["koordlet.json"]  # no temp file left behind
    cfg = parse_hook_file(path)
    assert cfg.failure_policy is FailurePolicy.IGNORE and cfg.timeout == 2.0 and cfg.priority == 0


def test_write_hook_config_optional_keys_and_overwrite(tmp_path: Path) -> None:
    path = write_hook_config(tmp_path, "h.json", "/run/h.sock", ["PreStartContainer"], failure_policy="Fail", timeout=0.5, priority=-1)
    doc = json.loads(path.read_text())
    assert doc["timeout"] == "500ms" and doc["priority"] == -1 and doc["failure-policy"] == "Fail"
    inode = os.stat(path).st_ino
    path2 = write_hook_config(tmp_path, "h.json", "/run/h2.sock", ["PreStartContainer"], FailurePolicy.FAIL, timeout="1.5s")
    assert path2 == path and os.stat(path).st_ino != inode  # replaced by rename, never rewritten in place
    cfg = parse_hook_file(path)
    assert (cfg.endpoint, cfg.timeout, cfg.priority) == ("/run/h2.sock", 1.5, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hooks": ["PreStopContainer"]}, "unknown runtime hook"),
        ({"failure_policy": "Sometimes"}, "unknown failure policy"),
        ({"endpoint": "relative.sock"}, "absolute"),
        ({"timeout": "2"}, "timeout"),
        ({"timeout": 0}, "positive"),
        ({"priority": 1.5}, "priority"),
        ({"name": "../escape"}, "invalid hook file name"),
        ({"name": ".hidden"}, "must not start with"),
    ],
)
def test_write_hook_config_validates_before_writing(tmp_path: Path, kwargs: dict, message: str) -> None:
    args = {"name": "h", "endpoint": "/run/h.sock", "hooks": ["PreCreateContainer"], **kwargs}
    with pytest.raises(ValueError, match=message):
        write_hook_config(tmp_path, **args)
    assert list(tmp_path.iterdir()) == []


async def test_registered_sdk_server_is_reachable_through_registry(sock_dir: Path) -> None:
    hook_dir = sock_dir / "hookserver.d"
    async with CpuSharesHook(sock_dir / "cpu.sock") as server:
        write_hook_config(hook_dir, "cpu", server.socket_path, ["PreCreateContainer"], failure_policy="Fail", timeout="1s")
        registry = HookRegistry(hook_dir)
        registry.reload()
        (cfg,) = registry.servers_for(HookType.PRE_CREATE_CONTAINER)
        assert cfg.endpoint == server.socket_path and cfg.failure_policy is FailurePolicy.FAIL
        async with grpc.aio.insecure_channel(f"unix://{cfg.endpoint}") as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            response = await stub.PreCreateContainerHook(container_request(), timeout=cfg.timeout)
        assert response.container_resources.cpu_shares == 512


def test_run_serves_on_uvloop_when_installed_and_on_asyncio_when_asked() -> None:
    from hooks.sdk import run
    from runtimeproxy import eventloop

    async def loop_name() -> str:
        return eventloop.running_loop_name()

    assert run(loop_name()) == "uvloop"  # a dependency of the package: installed
    assert run(loop_name(), "asyncio") == "asyncio"


# --------------------------------------------------------------------------- handlers checked at class definition


def test_a_plain_def_handler_is_refused_when_the_class_is_defined() -> None:
    """Before: accepted, then every call failed INTERNAL with "object
    ContainerResourceHookResponse can't be used in 'await' expression"."""
    with pytest.raises(TypeError, match=r"Sync\.pre_create_container must be 'async def'"):
        class Sync(HookServer):
            def pre_create_container(self, request):  # type: ignore[no-untyped-def,override]
                return api_pb2.ContainerResourceHookResponse()
    with pytest.raises(TypeError, match=r"SyncHandle\.handle must be 'async def'"):
        class SyncHandle(HookServer):
            def handle(self, hook, request):  # type: ignore[no-untyped-def,override]
                return None


@pytest.mark.parametrize("name", ["PreCreateContainerHook", "PreCreateContainer", "precreatecontainer"])
def test_a_handler_named_as_grpc_or_the_hook_point_is_refused(name: str) -> None:
    """Before: never called, so the hook answered "no change" without a word."""
    async def handler(self, request, context=None):  # type: ignore[no-untyped-def]
        return api_pb2.ContainerResourceHookResponse()

    with pytest.raises(TypeError, match=rf"Misnamed\.{name} is never called: the SDK calls "
                                        r"'async def pre_create_container\(self, request\)' for PreCreateContainer"):
        type("Misnamed", (HookServer,), {name: handler})
    # The right name, and helpers of other names, are fine.
    type("Named", (HookServer,), {"pre_create_container": handler, "PreCreateContainerLimit": 5, "helper": len})


# --------------------------------------------------------------------------- a handler past the caller's deadline


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_a_handler_cancelled_at_the_deadline_is_logged(
    sock_dir: Path, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: cancelled without a word, so a hook too slow for its hook
    file's timeout saw nothing while the proxy refused its calls. The call
    is a hand-driven client's, which never resets it: grpc's own reset it at
    its deadline, the server's too, and its RST_STREAM coming first (one run
    in seven or twenty) made the cancel a hang-up, logged at INFO."""
    class Slow(HookServer):
        async def pre_create_container(self, request):  # type: ignore[no-untyped-def]
            await asyncio.Event().wait()

    logged = asyncio.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "cancelled" in record.getMessage():
                logged.set()

    caplog.set_level(logging.INFO, "hooks.sdk")  # a cancel logged as a hang-up fails the level's assert below
    seen = Seen()
    logging.getLogger("hooks.sdk").addHandler(seen)
    try:
        async with Slow(sock_dir / "slow.sock", transport=transport) as server:
            peer = await raw_with_settings(Path(server.socket_path))
            try:
                method = HOOK_POINTS[HookType.PRE_CREATE_CONTAINER].full_method
                block = literal_headers([(":method", "POST"), (":scheme", "http"), (":path", method),
                                         (":authority", "localhost"), ("content-type", "application/grpc"),
                                         ("te", "trailers"), ("grpc-timeout", "100m")])
                request = container_request().SerializeToString()
                peer.writer.write(frame(HEADERS, END_HEADERS, 1, block)
                                  + frame(DATA, END_STREAM, 1, struct.pack(">BI", 0, len(request)) + request))
                status = None
                while status is None:  # to the block that ends the call; a reset would be the server's
                    read = await peer.until(HEADERS, 1)
                    assert not [f for f in read if f[0] == RST_STREAM], read
                    flags, payload = read[-1][1], read[-1][3]
                    headers = dict(peer.decoder.decode(payload))
                    if flags & END_STREAM:
                        status = headers.get("grpc-status", "none")
                assert status == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
            finally:
                await peer.close()
            await asyncio.wait_for(logged.wait(), 5)
    finally:
        logging.getLogger("hooks.sdk").removeHandler(seen)
    (record,) = [r for r in caplog.records if "cancelled" in r.getMessage()]
    assert record.levelno == logging.WARNING and record.hook == "PreCreateContainer"
    assert re.match(r"PreCreateContainer hook handler cancelled after \d+\.\d{3}s, before it answered: "
                    r"the caller's deadline \(the hook file's timeout\) passed", record.getMessage())


def _passing_through(handler):  # type: ignore[no-untyped-def]
    """A logging or metrics decorator's usual shape: a plain def returning the handler's coroutine."""
    @functools.wraps(handler)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        return handler(*args, **kwargs)
    return wrapper


async def test_handlers_that_return_a_coroutine_without_being_async_def_are_accepted_and_answer() -> None:
    """Before: each refused as "must be 'async def'", though the SDK answered
    them all (a decorator's plain def wrapper, a partialmethod, a staticmethod,
    a plain def handle returning super().handle's coroutine)."""
    def answer(name: str) -> api_pb2.ContainerResourceHookResponse:
        return api_pb2.ContainerResourceHookResponse(container_envs={"BY": name})

    class Various(HookServer):
        @_passing_through
        async def pre_create_container(self, request):  # type: ignore[no-untyped-def]
            return answer("decorated")

        async def _start(self, request, name):  # type: ignore[no-untyped-def]
            return answer(name)

        pre_start_container = functools.partialmethod(_start, name="partialmethod")

        @staticmethod
        async def post_start_container(request):  # type: ignore[no-untyped-def]
            return answer("staticmethod")

    with pytest.warns(RuntimeWarning, match=r"Delegating\.handle is not 'async def': the SDK awaits what it returns"):
        class Delegating(Various):
            def handle(self, hook, request):  # type: ignore[no-untyped-def]
                return super().handle(hook, request)

    server = Delegating("/tmp/unused-by-this-test.sock")
    for hook, name in [(HookType.PRE_CREATE_CONTAINER, "decorated"), (HookType.PRE_START_CONTAINER, "partialmethod"),
                       (HookType.POST_START_CONTAINER, "staticmethod")]:
        assert await routes.answer(server, hook, container_request()) == answer(name)
    # What stays refused: a plain def, one behind a partialmethod or staticmethod, not a callable at all.
    for value in (lambda self, request: None, functools.partialmethod(lambda self, request: None),
                  staticmethod(lambda request: None), None):
        with pytest.raises(TypeError, match=r"Plain\.pre_create_container must be 'async def'"):
            type("Plain", (HookServer,), {"pre_create_container": value})


def test_an_async_generator_handler_is_refused_as_one_that_yields() -> None:
    """Before: refused as "must be 'async def'", which it is."""
    with pytest.raises(TypeError, match=r"Yields\.pre_create_container yields: a handler returns its answer"):
        class Yields(HookServer):
            async def pre_create_container(self, request):  # type: ignore[no-untyped-def]
                yield api_pb2.ContainerResourceHookResponse()


def test_a_mixin_s_handlers_are_checked_and_a_nested_class_named_as_a_hook_point_is_not() -> None:
    """Before: a mixin's plain def handler or misnamed method passed (only
    the class's own were read), and a nested class named PreCreateContainer
    was refused as a misnamed handler."""
    class Plain:
        def pre_create_container(self, request):  # type: ignore[no-untyped-def]
            return None

    class Misnamed:
        async def PreStartContainer(self, request):  # type: ignore[no-untyped-def]
            return None

    with pytest.raises(TypeError, match=r"Plain\.pre_create_container must be 'async def'"):
        type("WithPlain", (Plain, HookServer), {})
    with pytest.raises(TypeError, match=r"Misnamed\.PreStartContainer is never called"):
        type("WithMisnamed", (Misnamed, HookServer), {})
    # Overridden by the class: its own is what the SDK calls.
    type("Overriding", (Plain, HookServer), {"pre_create_container": HookServer.pre_create_container})

    class Nested(HookServer):
        class PreCreateContainer:  # settings of the hook, say
            cpu_shares = 512


class _Logged(logging.Handler):
    """Counts the records whose message holds ``text`` as they are logged, so
    that a test awaits the next one instead of polling caplog."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.count = 0
        self._loop = asyncio.get_running_loop()
        self._more = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.count += 1
            self._loop.call_soon_threadsafe(self._more.set)  # (grpc may log from a thread of its own)

    async def reaches(self, count: int, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while self.count < count:
                self._more.clear()  # (no await since the check: nothing was logged in between)
                await self._more.wait()


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_a_handler_cancelled_by_a_hang_up_or_a_stop_is_logged_at_info(
    sock_dir: Path, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: at warning as a missed deadline might be, though kubelet
    cancelling its call (the proxy resets the hook call) or a stop is no
    fault of the hook."""
    started = asyncio.Event()

    class Slow(HookServer):
        async def pre_create_container(self, request):  # type: ignore[no-untyped-def]
            started.set()
            await asyncio.Event().wait()

    def cancelled() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "cancelled" in r.getMessage()]

    caplog.set_level(logging.INFO, "hooks.sdk")
    logged = _Logged("cancelled")
    logging.getLogger("hooks.sdk").addHandler(logged)
    try:
        async with Slow(sock_dir / "slow.sock", transport=transport) as server, \
                grpc.aio.insecure_channel(server.target) as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            call = stub.PreCreateContainerHook(container_request(), timeout=30)
            await asyncio.wait_for(started.wait(), 5)
            call.cancel()  # the caller hangs up, well before its deadline
            await logged.reaches(1)
            started.clear()
            call = stub.PreCreateContainerHook(container_request(), timeout=30)
            await asyncio.wait_for(started.wait(), 5)
            await server.stop(0)
            await logged.reaches(2)
    finally:
        logging.getLogger("hooks.sdk").removeHandler(logged)
    for record in cancelled():
        assert record.levelno == logging.INFO and record.hook == "PreCreateContainer"
        assert re.match(r"PreCreateContainer hook handler cancelled after \d+\.\d{3}s, before it answered: "
                        r"the caller hung up, or the server stopped$", record.getMessage())
