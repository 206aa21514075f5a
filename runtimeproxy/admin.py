"""The admin service: what a running proxy says about itself (`runtime-proxy status`).

Served on the proxy socket by the same grpc server, next to health, as
``/runtimeproxy.admin.v1.Admin/Status``. The request is a
``google.protobuf.Empty``, the answer a ``google.protobuf.BytesValue`` whose
value is a JSON document: well-known types, so any gRPC client can call it
without a schema of ours, and the document can grow without a proto change
(it is for operators and scripts, which read JSON anyway). Access is the
proxy socket's: root and its group.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import empty_pb2, wrappers_pb2
from grpc import aio

from .cripath.backend import CRI_VERSIONS
from .cripath.imagewatch import ImageWatch
from .cripath.server import Proxy
from .hookpath.registry import HookRegistry
from .host.unixsocket import check_path_length, connect_failure, grpc_target
from .metrics import Metrics
from .shown import shown

SERVICE = "runtimeproxy.admin.v1.Admin"
STATUS = f"/{SERVICE}/Status"
# A reason quotes values through shown(), so it is short; this cap keeps one
# that does not (a bug) from pushing the answer past grpc's 4 MiB message limit.
MAX_REASON = 1000
MAX_REJECTED = 100  # rejected hook files listed; with MAX_REASON the answer stays near 110 kB, far below grpc's 4 MiB


@dataclass(frozen=True)
class StatusSource:
    """What the status document is read from, at the moment it is asked for."""

    proxy: Proxy
    registry: HookRegistry
    metrics: Metrics
    started_wall: float
    started_monotonic: float

    def document(self) -> dict[str, Any]:
        backend = self.proxy.backend
        info = backend.info
        plan = self.proxy.router.plan
        last = self.registry.last_reload
        rejected = sorted(last.rejected.items())
        return {
            "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self.started_monotonic, 1),
            "started_at": self.started_wall,
            "listen": str(self.proxy.config.listen),
            "backend": {
                "socket": str(backend.runtime_socket),
                "image_socket": str(backend.image_socket),
                # A separate image service's state (None: the runtime's socket serves images):
                # serving (the key's name is older than its probe), and if not, why.
                "image_connected": None if self.proxy.images is None else self.proxy.images.up,
                "image_problem": _image_problem(self.proxy.images),
                # The CRI versions it was found serving, and of the versions image calls are sent
                # in, those it lacks (their calls fail UNIMPLEMENTED there); None: not known.
                "image_versions": _image_versions(self.proxy.images),
                "image_lacking": _image_lacking(self.proxy.images),
                "connected": backend.connected,
                "runtime_name": info.runtime_name if info else None,
                "runtime_version": info.runtime_version if info else None,
                "versions": sorted(info.versions) if info else [],
            },
            "served": {
                str(client): ("native" if plan.routes[client] == client else f"translated to {plan.routes[client]}")
                for client in CRI_VERSIONS
                if plan is not None and client in plan.routes
            },
            "calls": {"served": self.metrics.cri.served, "in_flight": self.metrics.cri.active},
            "hook_servers": [self._hook_server(name) for name in self.registry.snapshot.servers],
            "hook_dir": str(self.registry.directory),
            "hook_dir_problem": last.directory_error,
            "hook_dir_unsafe": last.directory_unsafe,  # refused as unsafe
            # not read (unsafe, unreadable, not a directory: a file in its place or its path): the hooks loaded before stay
            "hook_dir_kept": last.directory_kept,
            "hook_files_rejected": {name: _cut(reason) for name, reason in rejected[:MAX_REJECTED]},
            "hook_files_rejected_more": max(0, len(rejected) - MAX_REJECTED),  # left out of the list above
        }

    def _hook_server(self, name: str) -> dict[str, Any]:
        server = self.registry.snapshot.servers[name]
        stats = self.metrics.hook_stats.get(name)
        return {
            "name": name,
            "endpoint": server.endpoint,
            "hooks": sorted(h.value for h in server.hooks),
            "failure_policy": server.failure_policy.value,
            "timeout_s": server.timeout,
            "priority": server.priority,
            "calls": dict(sorted(stats.calls.items())) if stats else {},
            "last_error": stats.last_error if stats else None,
        }


def _image_problem(images: ImageWatch | None) -> str | None:
    if images is None or images.up or images.reason is None:
        return None
    return _cut(images.reason)


def _image_versions(images: ImageWatch | None) -> list[str] | None:
    if images is None or images.versions is None:
        return None
    return sorted(f"{v} (unknown)" if v in images.unknown else str(v) for v in images.versions)


def _image_lacking(images: ImageWatch | None) -> list[str] | None:
    """None while not known: no separate image service, it does not serve
    (not probed, or down), or the proxy has no plan yet."""
    if images is None or not images.up or images.versions is None or images.targets is None:
        return None
    return sorted(map(str, images.lacking))


def _cut(reason: str) -> str:
    if len(reason) <= MAX_REASON:
        return reason
    return f"{reason[:MAX_REASON]}... ({len(reason)} characters, cut; the proxy's log has it whole)"


class AdminService(grpc.GenericRpcHandler):
    def __init__(self, document: Callable[[], Mapping[str, Any]]) -> None:
        async def status(request: bytes, context: aio.ServicerContext) -> bytes:
            payload = json.dumps(document(), sort_keys=True).encode()
            return wrappers_pb2.BytesValue(value=payload).SerializeToString()

        self._status = grpc.unary_unary_rpc_method_handler(status)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._status if handler_call_details.method == STATUS else None


async def fetch_status(socket: Path, timeout: float = 5.0) -> dict[str, Any]:
    """Ask the proxy listening on ``socket``; raises aio.AioRpcError, or
    UnixSocketError for a path no socket can have or grpc cannot dial."""
    check_path_length(socket)  # else grpc logs parse_address errors to stderr, then UNAVAILABLE
    async with aio.insecure_channel(grpc_target(socket)) as channel:
        raw = await channel.unary_unary(STATUS)(empty_pb2.Empty().SerializeToString(), timeout=timeout)
    return json.loads(wrappers_pb2.BytesValue.FromString(raw).value)


def unreachable(
    socket: Path, exc: aio.AioRpcError, timeout: float, *, config_file: Path | None = None, relative: str | None = None,
) -> str:
    """Why ``status`` got no answer from ``socket``, and what to do about it;
    ``relative``: the listen of ``config_file``, as written, that named it."""
    code, details = exc.code(), exc.details() or ""
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return (f"{socket} answers gRPC but has no runtime-proxy status service: it is not a runtime-proxy's "
                "socket (a runtime's own?), or that runtime-proxy predates `status`; give the proxy's --listen")
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the proxy at {socket} did not answer within {timeout:g}s (--timeout); is it stuck? its log says more"
    raw = f"{code.name}: {details}"
    try:
        mode = socket.stat().st_mode
    except FileNotFoundError:
        if relative is not None:  # serve, under systemd, took it from /
            return (f"no socket at {socket}: the listen of {config_file}, {shown(relative)}, is a relative path, "
                    "taken here from the current directory, and by serve from its own (/ under systemd): "
                    "give --listen with the socket's absolute path")
        return (f"no socket at {socket}: no proxy is running there (`systemctl status runtime-proxy`), "
                "or it listens elsewhere: give --listen PATH, or --config FILE as serve was started with")
    except OSError as err:
        return f"cannot look at {socket}: {err.strerror} ({raw})"
    if not stat.S_ISSOCK(mode):
        return f"{socket} is not a unix socket: give the proxy's --listen PATH"
    # Probed here, not read from grpc's details: their wording is grpc's own, and may change.
    failure = connect_failure(socket)
    if failure is not None and failure.errno == errno.EACCES:
        return f"no permission to connect to {socket}: the proxy's socket is for root and its group; run as root"
    if failure is not None and failure.nobody_listens:
        return (f"nothing listens on {socket}: a socket left behind by a proxy that was killed, "
                "or one still starting (`systemctl status runtime-proxy`)")
    return f"cannot get the status from the proxy at {socket}: {raw}"


def _image_line(backend: Mapping[str, Any]) -> str:
    """A separate image service's state, after the backend's ("": none, or a proxy older than the key)."""
    serving = backend.get("image_connected")
    if serving is None:
        return ""
    if serving:
        versions = backend.get("image_versions")  # `.get`: a proxy older than the key
        lacking = backend.get("image_lacking")
        return (f"; images at {backend['image_socket']}, serving"
                + (f" CRI {', '.join(versions) or 'none'}" if versions is not None else "")
                + (f", LACKING CRI {', '.join(lacking)} (its image calls fail)" if lacking else ""))
    problem = backend.get("image_problem")  # `.get`: a proxy older than the key
    return f"; images at {backend['image_socket']}, NOT SERVING" + (f" ({_printable(problem)})" if problem else "")


def render(doc: Mapping[str, Any], now: float | None = None) -> str:
    """The status for a person at a terminal (``now``: the wall clock, for how long ago)."""
    now = time.time() if now is None else now
    backend = doc["backend"]
    runtime = f"{backend['runtime_name']} {backend['runtime_version']}" if backend["runtime_name"] else "not probed yet"
    state = "connected" if backend["connected"] else "NOT CONNECTED"
    versions = ", ".join(backend["versions"]) or "none"
    served = ", ".join(f"{v} ({how})" for v, how in doc["served"].items()) or "nothing"
    lines = [
        f"runtime-proxy pid {doc['pid']}, up {_duration(doc['uptime_s'])}, listening on {doc['listen']}",
        f"backend: {runtime} at {backend['socket']}, {state}; CRI {versions}" + _image_line(backend),
        f"serving: CRI {served}",
        f"calls served: {doc['calls']['served']} ({doc['calls']['in_flight']} in flight)",
        f"hook servers: {len(doc['hook_servers'])}" + (f", from {_printable(doc['hook_dir'])}" if "hook_dir" in doc else ""),
    ]
    if doc.get("hook_dir_problem"):  # `.get`: a proxy older than these keys
        kept = ""
        if doc.get("hook_dir_kept", doc.get("hook_dir_unsafe")):  # an older proxy kept them only when unsafe
            names = ", ".join(_printable(server["name"]) for server in doc["hook_servers"])
            kept = f" (the hooks loaded before stay in force: {names})" if names else " (no hook was loaded before it)"
        lines.append(f"  hook directory: {_printable(doc['hook_dir_problem'])}{kept}")
    for server in doc["hook_servers"]:
        calls = ", ".join(f"{outcome} {n}" for outcome, n in server["calls"].items()) or "none"
        lines.append(
            f"  {_printable(server['name'])}: {_printable(server['endpoint'])}, policy {server['failure_policy']}, "
            f"timeout {server['timeout_s']:g}s, priority {server['priority']}"
        )
        lines.append(f"    hooks: {', '.join(server['hooks'])}")
        lines.append(f"    calls: {calls}")
        error = server["last_error"]
        if error:
            at = _when(error["at"])
            cause = f": {_printable(error['cause'])}" if error.get("cause") else ""  # `.get`: a proxy older than it
            lines.append(f"    last error: {error['outcome']} on {error['hook']} at {at}{cause}")
            error_state = _error_state(error, now)
            if error_state:
                lines.append(f"      {error_state}")
    rejected = doc.get("hook_files_rejected") or {}
    more = doc.get("hook_files_rejected_more") or 0  # `.get`: a proxy older than this key lists them all
    if rejected or more:
        lines.append(f"hook files rejected: {len(rejected) + more} (fix or remove them; `runtime-proxy check-config`)")
    loaded = {server["name"] for server in doc["hook_servers"]}
    for name, reason in rejected.items():
        kept = "; its last good version, above, stays in force" if name in loaded else ""
        lines.append(f"  {_printable(name)}: {_printable(reason)}{kept}")
    if more:
        lines.append(f"  ... and {more} more")
    return "\n".join(lines)


def _error_state(error: Mapping[str, Any], now: float) -> str | None:
    """Whether a hook server's last error is current or past: a line of its own,
    so that the one before reads as it always did. None from a proxy older than it."""
    if "current" not in error:
        return None
    calls = error.get("failed_calls") or 1
    run = f"{calls} failed call{'s' if calls != 1 else ''}"
    how = _how_they_failed(error.get("failed_by_outcome"))
    if error["current"]:
        since = _when(error.get("failing_since") or error["at"])
        return f"now: still failing, {run} in a row since {since} (no call has succeeded since){how}"
    recovered = error["recovered_at"]
    return f"now: recovered {_duration(max(0.0, now - recovered))} ago, at {_when(recovered)}, after {run} in a row{how}"


# A run's failed calls by what the server did, for each sends the operator
# somewhere else: one that did not answer, to its process or socket; one
# that answered an error status, to its handler (its own log); one whose
# answers the proxy refused, to its answers; one not called, to its socket's
# owner or directory. Any outcome not named here is a status the server (or
# what stands for it, its HTTP/2 stack) answered.
_NO_ANSWER = "did not answer"
_KINDS: dict[str, str] = {
    "unavailable": _NO_ANSWER, "deadline_exceeded": _NO_ANSWER, "cancelled": _NO_ANSWER,
    "invalid_value": "answered invalid values", "invalid_answer": "answered invalid values",
    "untrusted_endpoint": "not called",
    "error": "failed in the proxy",  # an exception of its own calling the hook (its log has it at debug)
}
_ANSWERED_AN_ERROR = "answered an error"
_ORDER = (_NO_ANSWER, _ANSWERED_AN_ERROR, "answered invalid values", "not called", "failed in the proxy")


def _how_they_failed(by_outcome: Mapping[str, int] | None) -> str:
    """A run's failed calls by kind, each with its outcomes: '1 did not answer
    (unavailable), 2 answered an error (internal 1, unknown 1)'. Empty from a
    proxy older than ``failed_by_outcome``."""
    if not by_outcome:
        return ""
    kinds: dict[str, dict[str, int]] = {}
    for outcome, n in by_outcome.items():
        kinds.setdefault(_KINDS.get(outcome, _ANSWERED_AN_ERROR), {})[outcome] = n
    parts = []
    for kind in sorted(kinds, key=_ORDER.index):
        outcomes = kinds[kind]
        named = ", ".join(outcomes) if len(outcomes) == 1 else ", ".join(f"{o} {n}" for o, n in outcomes.items())
        parts.append(f"{sum(outcomes.values())} {kind} ({_printable(named)})")
    return ": " + ", ".join(parts)


def _when(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def _printable(text: str) -> str:
    """``text`` as is, or quoted if it has a newline or another unprintable
    character: a hook file's name is anyone's, and must not print a line of its own."""
    return text if text.isprintable() else repr(text)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours}h{minutes}m"
    if hours:
        return f"{hours}h{minutes}m"
    return f"{minutes}m{secs}s"
