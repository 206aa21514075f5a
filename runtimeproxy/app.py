"""Assembling a running proxy from its settings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from dataclasses import dataclass

from .admin import AdminService, StatusSource
from .config import ProxyConfig
from .cripath.backend import BackendInfo
from .cripath.fieldcheck import V1OnlyFieldCheck
from .cripath.server import Proxy
from .hookclient.transport import transport_for
from .hookpath.dispatch import Dispatcher
from .hookpath.nodefacts import NodeFactsSource
from .hookpath.parentcpuset import ParentCpusets
from .hookpath.registry import HookRegistry, HookSnapshot
from .hookpath.stage import HookStage
from .hookpath.store import StateStore
from .hookpath.validate import NodeFactsReader
from .metrics import Metrics
from .readiness import SystemdNotifier
from .supervisor import Supervisor, TaskName

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningProxy:
    proxy: Proxy
    registry: HookRegistry
    hooks: HookStage
    store: StateStore
    metrics: Metrics
    tasks: Supervisor


async def build_proxy(
    config: ProxyConfig, stack: contextlib.AsyncExitStack, listen_socket: socket.socket | None = None
) -> RunningProxy:
    """Start a proxy with every feature wired in; it stops when ``stack`` closes.
    ``listen_socket``: the listening socket from systemd, if activated."""
    metrics = Metrics()
    tasks = Supervisor()
    stack.push_async_callback(tasks.close)  # a start-up that failed half-way leaves nothing behind
    registry = HookRegistry(config.hook_dir, metrics=metrics.hook_config)
    registry.on_change(lambda snapshot: _count_servers(metrics, snapshot))
    registry.reload()
    # The data path's HTTP/2 stack calls the hook servers too: frames, the proxy's own; grpc, grpc.aio.
    # The node's facts are read now and again after CPU or memory hotplug (nodefacts.py);
    # parent cgroups' cpusets (cgroup v1) for each answer naming a cpuset.
    node = NodeFactsSource(NodeFactsReader(), parents=ParentCpusets.of_host())
    dispatcher = Dispatcher(registry, metrics, node=node, transport=transport_for(config.data_path))
    stack.push_async_callback(dispatcher.close)  # after the proxy stopped: post hooks use it until then
    store = StateStore()
    hooks = HookStage(dispatcher, store, metrics, tasks)
    proxy = Proxy(
        config, stages=[V1OnlyFieldCheck(forward_unknown=config.unknown_fields == "forward"), hooks],
        tasks=tasks,
        calls=metrics.cri,
        listen_socket=listen_socket,
    )
    store.read_backend = proxy.read_runtime

    images = proxy.images
    image_up = metrics.image_backend() if images is not None else None  # a separate image service: its own series

    def on_backend(info: BackendInfo) -> None:
        metrics.backend_up.set(1)
        plan = proxy.router.plan  # the router heard this probe first
        metrics.cri.serving(plan.routes if plan else {})
        hooks.refresh_records()
        if images is not None and image_up is not None:  # the proxy heard it first: the image side's targets are set
            image_up.set(int(images.usable))

    proxy.backend.on_change(on_backend)
    proxy.backend.on_lost(lambda: metrics.backend_up.set(0))
    if images is not None and image_up is not None:
        gauge = image_up
        images.on_change(lambda up: gauge.set(int(images.usable)))
    proxy.backend.on_reconnect(metrics.cri.reconnected)
    # Runs until cancelled (Proxy.stop stops it after the server); restarted if it dies.
    never = asyncio.Event()
    tasks.keep_running(TaskName.WATCHER, lambda: registry.watch(never))
    if config.state_resync_interval > 0:  # cancelled by Proxy.stop (STOP_ORDER), after the server
        tasks.keep_running(
            TaskName.RESYNC,
            lambda: store.resync_every(config.state_resync_interval, lambda: proxy.backend.connected),
        )
    if config.metrics_listen:  # stopped after the proxy: scraped until the end
        await metrics.serve(config.metrics_listen, stack)  # logs where it serves, or why not yet
    status = StatusSource(proxy, registry, metrics, time.time(), time.monotonic())
    proxy.server.add_generic_rpc_handlers((AdminService(status.document),))  # before the server starts
    await proxy.start()
    stack.push_async_callback(proxy.stop)
    notifier = SystemdNotifier(proxy, registry)
    stack.callback(notifier.stopping)  # before the proxy stops (the stack unwinds in reverse)
    notifier.attach(tasks)
    return RunningProxy(proxy, registry, hooks, store, metrics, tasks)


def _count_servers(metrics: Metrics, snapshot: HookSnapshot) -> None:
    metrics.hook_servers.set(len(snapshot))
