"""A small SDK to write a hook server (``runtime.v1alpha1.RuntimeHookService``) on grpc.aio.

Subclass :class:`HookServer` and override the handlers of the hooks you care
about; every other hook answers an empty response, which means "no change"::

    from cri_api.hookapi import api_pb2
    from hooks.sdk import HookServer, write_hook_config

    class CpuSharesHook(HookServer):
        async def pre_create_container(self, request):
            resources = api_pb2.LinuxContainerResources()
            resources.CopyFrom(request.container_resources)
            resources.cpu_shares = 512
            return api_pb2.ContainerResourceHookResponse(container_resources=resources)

    async def main():
        async with CpuSharesHook("/run/cpushares-hook.sock") as server:
            write_hook_config("/etc/runtime/hookserver.d", "cpushares", server.socket_path,
                              ["PreCreateContainer"], failure_policy="Fail", timeout="1s")
            await server.wait_for_termination()

Handlers are ``async def name(self, request) -> Response | None``; ``None``
means an empty response.  Raise :class:`HookAbort` to answer a specific gRPC
status; any other exception answers ``INTERNAL`` with the exception text.
To handle every hook generically, override :meth:`HookServer.handle` instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import stat
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import grpc
from google.protobuf.message import Message

from cri_api.hookapi import api_pb2, api_pb2_grpc
from runtimeproxy.hookpath.hookfile import (
    KEY_ENDPOINT,
    KEY_FAILURE_POLICY,
    KEY_PRIORITY,
    KEY_RUNTIME_HOOKS,
    KEY_TIMEOUT,
    FailurePolicy,
    HookConfigError,
    format_duration,
    parse_hook_document,
)
from runtimeproxy.hookpath.points import HookType

__all__ = [
    "HOOK_METHODS",
    "SERVICE_NAME",
    "HookAbort",
    "HookMethod",
    "HookServer",
    "HookServerError",
    "write_hook_config",
]

logger = logging.getLogger(__name__)

SERVICE_NAME = "runtime.v1alpha1.RuntimeHookService"
MAX_UNIX_PATH = 107  # sizeof(sun_path) - 1 on Linux


@dataclass(frozen=True)
class HookMethod:
    """How one hook point maps onto the gRPC service and onto HookServer."""

    hook: HookType
    rpc_name: str  # "PreCreateContainerHook"
    handler_name: str  # "pre_create_container"
    request_type: type[Message]
    response_type: type[Message]

    @property
    def full_method(self) -> str:
        return f"/{SERVICE_NAME}/{self.rpc_name}"


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


def _method(hook: HookType) -> HookMethod:
    if hook.is_pod_hook:
        req, resp = api_pb2.PodSandboxHookRequest, api_pb2.PodSandboxHookResponse
    else:
        req, resp = api_pb2.ContainerResourceHookRequest, api_pb2.ContainerResourceHookResponse
    return HookMethod(hook, hook.rpc_name, _snake(hook.value), req, resp)


HOOK_METHODS: Mapping[HookType, HookMethod] = MappingProxyType({h: _method(h) for h in HookType})


class HookAbort(Exception):
    """Raise from a handler to answer the call with a specific gRPC status."""

    def __init__(self, code: grpc.StatusCode = grpc.StatusCode.INTERNAL, details: str = "") -> None:
        super().__init__(details or code.name)
        self.code = code
        self.details = details


class HookServerError(RuntimeError):
    """The hook server could not start (socket in use, bad path...)."""


def _socket_state(path: Path) -> str:
    """'missing' | 'stale' | 'live' | 'other' (exists but is not a socket)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    if not stat.S_ISSOCK(st.st_mode):
        return "other"
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return "stale"
    except OSError:
        return "live"  # e.g. EACCES/timeout: someone may own it; do not steal it
    else:
        return "live"
    finally:
        probe.close()


class _Servicer(api_pb2_grpc.RuntimeHookServiceServicer):
    def __init__(self, server: HookServer) -> None:
        self._server = server

    async def PreRunPodSandboxHook(self, request, context):  # noqa: N802 (gRPC names)
        return await self._server._dispatch(HookType.PRE_RUN_POD_SANDBOX, request, context)

    async def PostStopPodSandboxHook(self, request, context):  # noqa: N802
        return await self._server._dispatch(HookType.POST_STOP_POD_SANDBOX, request, context)

    async def PreCreateContainerHook(self, request, context):  # noqa: N802
        return await self._server._dispatch(HookType.PRE_CREATE_CONTAINER, request, context)

    async def PreStartContainerHook(self, request, context):  # noqa: N802
        return await self._server._dispatch(HookType.PRE_START_CONTAINER, request, context)

    async def PostStartContainerHook(self, request, context):  # noqa: N802
        return await self._server._dispatch(HookType.POST_START_CONTAINER, request, context)

    async def PostStopContainerHook(self, request, context):  # noqa: N802
        return await self._server._dispatch(HookType.POST_STOP_CONTAINER, request, context)

    async def PreUpdateContainerResourcesHook(self, request, context):  # noqa: N802
        return await self._server._dispatch(HookType.PRE_UPDATE_CONTAINER_RESOURCES, request, context)


class HookServer:
    """A ``RuntimeHookService`` server on a unix socket.

    Override the handlers below (or :meth:`handle`).  Lifecycle: ``await
    start()`` / ``await stop(grace)``, or ``async with``.  ``start`` removes a
    stale socket file (one nobody listens on) but refuses to replace a live
    socket or a non-socket file; the socket is chmod-ed to ``socket_mode``.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        socket_mode: int = 0o660,
        grace: float | None = 1.0,
        options: Sequence[tuple[str, Any]] | None = None,
    ) -> None:
        self._socket_path = Path(socket_path).absolute()
        if len(os.fsencode(self._socket_path)) > MAX_UNIX_PATH:
            raise ValueError(
                f"unix socket path too long ({len(os.fsencode(self._socket_path))} > {MAX_UNIX_PATH} bytes): "
                f"{self._socket_path}"
            )
        self._socket_mode = socket_mode
        self._grace = grace
        self._options = list(options or ())
        self._server: grpc.aio.Server | None = None
        self._socket_identity: tuple[int, int] | None = None

    # -- handlers: override the ones you need ----------------------------------

    async def pre_run_pod_sandbox(self, request: api_pb2.PodSandboxHookRequest) -> api_pb2.PodSandboxHookResponse | None:
        return None

    async def post_stop_pod_sandbox(
        self, request: api_pb2.PodSandboxHookRequest
    ) -> api_pb2.PodSandboxHookResponse | None:
        return None

    async def pre_create_container(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def pre_start_container(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def post_start_container(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def post_stop_container(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def pre_update_container_resources(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def handle(self, hook: HookType, request: Message) -> Message | None:
        """Generic entry point of every call; by default dispatches to the handler method."""
        return await getattr(self, HOOK_METHODS[hook].handler_name)(request)

    # -- lifecycle ---------------------------------------------------------------

    @property
    def socket_path(self) -> str:
        """The absolute socket path (what goes into a hook file's "remote-endpoint")."""
        return str(self._socket_path)

    @property
    def target(self) -> str:
        """The gRPC target to dial this server: ``unix:///path``."""
        return f"unix://{self._socket_path}"

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        if self._server is not None:
            raise HookServerError("hook server already started")
        path = self._socket_path
        state = _socket_state(path)
        if state == "live":
            raise HookServerError(f"{path} is in use by another server")
        if state == "other":
            raise HookServerError(f"{path} exists and is not a unix socket; refusing to replace it")
        if state == "stale":
            logger.info("removing stale hook server socket %s", path, extra={"socket": str(path)})
            path.unlink(missing_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)

        server = grpc.aio.server(options=self._options)
        api_pb2_grpc.add_RuntimeHookServiceServicer_to_server(_Servicer(self), server)
        try:
            if server.add_insecure_port(self.target) == 0:  # older grpcio signal failure this way
                raise RuntimeError("bind failed")
        except RuntimeError as exc:
            raise HookServerError(f"cannot listen on {path}: {exc}") from exc
        await server.start()
        try:
            os.chmod(path, self._socket_mode)
            st = os.lstat(path)
            self._socket_identity = (st.st_dev, st.st_ino)
        except OSError:
            await server.stop(None)
            raise
        self._server = server
        logger.info("hook server listening on %s", path, extra={"socket": str(path)})

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving; in-flight calls get ``grace`` seconds (default: the constructor's)."""
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop(self._grace if grace is None else grace)
        # Remove our socket, unless someone else has replaced it meanwhile.
        try:
            st = os.lstat(self._socket_path)
            if (st.st_dev, st.st_ino) == self._socket_identity:
                self._socket_path.unlink()
        except FileNotFoundError:
            pass
        self._socket_identity = None

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Wait until the server stops; returns True on timeout (like grpc)."""
        if self._server is None:
            return False
        return await self._server.wait_for_termination(timeout)

    async def __aenter__(self) -> HookServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- dispatch ------------------------------------------------------------------

    async def _dispatch(self, hook: HookType, request: Message, context: grpc.aio.ServicerContext) -> Message:
        method = HOOK_METHODS[hook]
        try:
            response = await self.handle(hook, request)
        except HookAbort as exc:
            await context.abort(exc.code, exc.details)
            raise  # unreachable: abort raises
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("%s hook handler failed", hook.value, extra={"hook": hook.value})
            await context.abort(grpc.StatusCode.INTERNAL, f"{hook.value} hook failed: {exc}")
            raise  # unreachable
        if response is None:
            return method.response_type()
        if not isinstance(response, method.response_type):
            logger.error(
                "%s hook handler returned %s, expected %s",
                hook.value,
                type(response).__name__,
                method.response_type.__name__,
                extra={"hook": hook.value},
            )
            await context.abort(
                grpc.StatusCode.INTERNAL,
                f"{hook.value} hook handler returned {type(response).__name__}, "
                f"expected {method.response_type.__name__}",
            )
        return response


def write_hook_config(
    directory: str | os.PathLike[str],
    name: str,
    endpoint: str | os.PathLike[str],
    hooks: Iterable[HookType | str],
    failure_policy: FailurePolicy | str = "Ignore",
    timeout: str | float | None = None,
    priority: int | None = None,
) -> Path:
    """Atomically write a Koordinator-format hook file ``directory/name[.json]``; returns its path.

    ``timeout`` is a duration string ("500ms") or seconds (0.5 -> "500ms");
    ``None`` omits the key (the proxy's default applies), as does ``priority=None``.
    The document is validated like the proxy would before anything is written
    (``ValueError`` otherwise).  The file is written to a temporary file in the
    same directory, fsync-ed, chmod-ed 0644 and renamed into place, so the
    proxy never sees a partial file.  A missing directory is created (0755).
    """
    directory = Path(directory)
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"invalid hook file name {name!r}")
    if not name.endswith(".json"):
        name = f"{name}.json"
    if name.startswith("."):
        raise ValueError(f"hook file name {name!r} must not start with '.' (hidden files are ignored)")

    hook_names: list[str] = []
    for hook in hooks:
        try:
            value = HookType(hook).value
        except ValueError:
            raise ValueError(f"unknown runtime hook {hook!r}") from None
        if value not in hook_names:
            hook_names.append(value)
    try:
        policy = FailurePolicy(failure_policy).value
    except ValueError:
        raise ValueError(f"unknown failure policy {failure_policy!r}") from None

    doc: dict[str, object] = {
        KEY_ENDPOINT: os.fspath(endpoint),
        KEY_FAILURE_POLICY: policy,
        KEY_RUNTIME_HOOKS: hook_names,
    }
    if timeout is not None:
        doc[KEY_TIMEOUT] = timeout if isinstance(timeout, str) else format_duration(timeout)
    if priority is not None:
        doc[KEY_PRIORITY] = priority
    try:
        parse_hook_document(directory / name, doc)
    except HookConfigError as exc:
        raise ValueError(str(exc)) from None

    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o755)
    data = (json.dumps(doc, indent=2) + "\n").encode()
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        final = directory / name
        os.replace(tmp_name, final)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    try:
        dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:  # pragma: no cover - best effort durability
        pass
    return final
