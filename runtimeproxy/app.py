"""Assembling a running proxy from its settings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from .config import ProxyConfig
from .cripath.backend import BackendInfo
from .cripath.fieldcheck import V1OnlyFieldCheck
from .cripath.server import Proxy
from .hookpath.dispatch import Dispatcher
from .hookpath.registry import HookRegistry, HookSnapshot
from .hookpath.stage import HookStage
from .hookpath.store import StateStore
from .metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningProxy:
    proxy: Proxy
    registry: HookRegistry
    hooks: HookStage
    store: StateStore
    metrics: Metrics


async def build_proxy(config: ProxyConfig, stack: contextlib.AsyncExitStack) -> RunningProxy:
    """Start a proxy with every feature wired in; it stops when ``stack`` closes."""
    metrics = Metrics()
    registry = HookRegistry(config.hook_dir, metrics=metrics.hook_config)
    registry.on_change(lambda snapshot: _count_servers(metrics, snapshot))
    registry.reload()
    dispatcher = Dispatcher(registry, metrics)
    stack.push_async_callback(dispatcher.close)
    store = StateStore()
    hooks = HookStage(dispatcher, store, metrics)
    stack.push_async_callback(hooks.drain)  # after the server stopped, before the channels close
    proxy = Proxy(config, stages=[V1OnlyFieldCheck(forward_unknown=config.unknown_fields == "forward"), hooks])
    store.read_backend = proxy.read_runtime

    tasks: set[asyncio.Task[None]] = set()

    def on_backend(info: BackendInfo) -> None:
        metrics.backend_up.set(1)
        task = asyncio.get_running_loop().create_task(_rebuild(store), name="state-rebuild")
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    proxy.backend.on_change(on_backend)
    proxy.backend.on_lost(lambda: metrics.backend_up.set(0))
    stop_watch = asyncio.Event()
    watch = asyncio.create_task(registry.watch(stop_watch), name="hook-dir-watch")

    async def stop_background() -> None:
        stop_watch.set()
        for task in (watch, *tasks):
            task.cancel()
        await asyncio.gather(watch, *tasks, return_exceptions=True)

    stack.push_async_callback(stop_background)
    await proxy.start()
    stack.push_async_callback(proxy.stop)
    if config.metrics_listen:
        stack.callback(metrics.serve(config.metrics_listen))
        log.info("serving metrics", extra={"address": config.metrics_listen})
    return RunningProxy(proxy, registry, hooks, store, metrics)


def _count_servers(metrics: Metrics, snapshot: HookSnapshot) -> None:
    metrics.hook_servers.set(len(snapshot))


async def _rebuild(store: StateStore) -> None:
    try:
        await store.rebuild()
    except Exception as exc:  # the store also reads on demand; this only warms it
        log.warning("state rebuild failed; records will be read on demand", extra={"error": str(exc)})
