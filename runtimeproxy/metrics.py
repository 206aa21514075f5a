"""Prometheus metrics, in a registry of the proxy's own (no global state)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

HOOK_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._hook_calls = Counter(
            "runtime_proxy_hook_calls",
            "Calls to hook servers, by server, hook point and outcome (ok or a gRPC code).",
            ["server", "hook", "outcome"],
            registry=self.registry,
        )
        self._hook_seconds = Histogram(
            "runtime_proxy_hook_duration_seconds",
            "Round trip of one hook call.",
            ["hook"],
            buckets=HOOK_BUCKETS,
            registry=self.registry,
        )
        self._hooked = Counter(
            "runtime_proxy_hooked_calls",
            "CRI calls that went through hooks, by method and outcome.",
            ["method", "outcome"],
            registry=self.registry,
        )
        self._hooked_seconds = Histogram(
            "runtime_proxy_hooked_call_duration_seconds",
            "CRI calls that went through hooks, end to end (hooks and backend).",
            ["method"],
            registry=self.registry,
        )
        self.backend_up = Gauge(
            "runtime_proxy_backend_ready",
            "1 while the backend is connected and answered a version probe; 0 before and while it is lost.",
            registry=self.registry,
        )
        self.hook_servers = Gauge(
            "runtime_proxy_hook_servers", "Hook servers registered from the hook directory.", registry=self.registry
        )
        self.hook_config = HookConfigMetrics(self.registry)

    def hook_call(self, server: str, hook: str, outcome: str, seconds: float) -> None:
        self._hook_calls.labels(server, hook, outcome).inc()
        self._hook_seconds.labels(hook).observe(seconds)

    def hooked_call(self, method: str, outcome: str, seconds: float) -> None:
        self._hooked.labels(method, outcome).inc()
        self._hooked_seconds.labels(method).observe(seconds)

    def serve(self, address: str) -> Callable[[], None]:
        """Serve /metrics on host:port in a background thread; returns the stop function."""
        host, _, port = address.rpartition(":")
        server, _thread = start_http_server(int(port), addr=host or "127.0.0.1", registry=self.registry)
        return server.shutdown


class HookConfigMetrics:
    """The hook directory's health: what an operator alerts on (issue 11)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.dir_refused = Gauge(
            "runtime_proxy_hook_dir_refused",
            "1 while the hook directory is refused as unsafe (group/other-writable or not owned by root): "
            "nothing in it is loaded and the last good hook set stays in force.",
            registry=registry,
        )
        self.files_rejected = Gauge(
            "runtime_proxy_hook_files_rejected",
            "Hook files currently rejected (invalid or unsafe); one that was good before keeps its last good version.",
            registry=registry,
        )
