"""What the proxy tells systemd: READY=1, STATUS= lines, watchdog pings.

READY=1 goes out once the proxy listens and the backend answered its first
probe (so a unit ordered after it finds a proxy that forwards calls). STATUS=
says what is served, and is sent again whenever that changes (backend lost
or back, versions, hook servers). With ``WatchdogSec`` set, a supervised task
pings at half the interval from the event loop: if the loop is stuck, the
pings stop and systemd restarts the proxy, which is the point.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from .cripath.server import Proxy
from .hookpath.registry import HookRegistry
from .host import sdnotify
from .supervisor import Supervisor

log = logging.getLogger(__name__)

WATCHDOG_TASK = "systemd-watchdog"
REASON_MAX = 80  # characters of an image backend's reason on the status line


def describe(proxy: Proxy, hook_servers: int) -> str:
    """One line for `systemctl status`, e.g. "serving CRI v1 (native),
    v1alpha2 (translated) for containerd 1.6.20; 2 hook servers"."""
    hooks = f"{hook_servers} hook server{'' if hook_servers == 1 else 's'}"
    info = proxy.backend.info
    if info is None:
        return f"waiting for the backend runtime at {proxy.backend.runtime_socket}; {hooks}"
    runtime = f"{info.runtime_name} {info.runtime_version}"
    if not proxy.backend.connected:
        return f"backend {runtime} unreachable at {proxy.backend.runtime_socket}, probing; {hooks}"
    plan = proxy.router.plan
    if plan is None:
        return f"cannot serve {runtime} (CRI {', '.join(sorted(info.versions))}): see the log; {hooks}"
    served = ", ".join(
        f"{client} ({'native' if target == client else 'translated'})" for client, target in sorted(plan.routes.items())
    )
    images = proxy.images
    if images is not None and not images.up:  # image calls fail: pulls, and so pods whose image is missing
        why = f" ({_short(images.lost_reason)})" if images.lost_reason else ""
        return f"serving CRI {served} for {runtime}, but the image backend at {images.socket} is not serving{why}; {hooks}"
    if images is not None and images.lacking:  # those versions' image calls fail UNIMPLEMENTED there
        lacks = ", ".join(sorted(images.lacking))
        return f"serving CRI {served} for {runtime}, but the image backend at {images.socket} lacks CRI {lacks}; {hooks}"
    return f"serving CRI {served} for {runtime}; {hooks}"


def _short(reason: str) -> str:
    """A reason on one short line: a probe's message may run long, and the log has it whole."""
    line = " ".join(reason.split())
    return line if len(line) <= REASON_MAX else line[: REASON_MAX - 3] + "..."


class SystemdNotifier:
    def __init__(
        self, proxy: Proxy, registry: HookRegistry, environ: Mapping[str, str] | None = None
    ) -> None:
        self._proxy = proxy
        self._registry = registry
        self._environ = environ
        self._ready = False
        self._status = ""

    def attach(self, tasks: Supervisor) -> None:
        """Once the proxy listens: follow the backend and the hook set."""
        self._proxy.backend.on_change(lambda info: self.update())
        self._proxy.backend.on_lost(self.update)
        if self._proxy.images is not None:
            self._proxy.images.on_change(lambda up: self.update())
        self._registry.on_change(lambda snapshot: self.update())
        interval = sdnotify.watchdog_interval(self._environ)
        if interval is not None:
            log.info("pinging the systemd watchdog", extra={"interval_s": interval})
            tasks.keep_running(WATCHDOG_TASK, lambda: self._watchdog(interval))
        self.update()

    def update(self) -> None:
        status = describe(self._proxy, len(self._registry.snapshot))
        ready = not self._ready and self._proxy.backend.connected
        if status == self._status and not ready:
            return
        self._status = status
        message = f"STATUS={status}"
        if ready:
            self._ready = True
            message = "READY=1\n" + message
        self._send(message)

    def stopping(self) -> None:
        self._send("STOPPING=1\nSTATUS=stopping: draining calls")

    async def _watchdog(self, interval: float) -> None:
        while True:
            self._send("WATCHDOG=1")
            await asyncio.sleep(interval)

    def _send(self, message: str) -> None:
        sdnotify.notify(message, self._environ)
