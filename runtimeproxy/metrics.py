"""Prometheus metrics, in a registry of the proxy's own (no global state)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .cripath.methods import ApiVersion, MethodRef, metric_ref
from .loopmetrics import Count, CounterFamily, HistogramFamily, Observed
from .metricshttp import MetricsListener, serve

HOOK_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # Updated on every call: the event loop's own families (loopmetrics.py).
        self._hook_calls = CounterFamily(
            "runtime_proxy_hook_calls",
            "Calls to hook servers, by server, hook point and outcome (ok or a gRPC code).",
            ["server", "hook", "outcome"],
            self.registry,
        )
        self._hook_seconds = HistogramFamily(
            "runtime_proxy_hook_duration_seconds",
            "Round trip of one hook call.",
            ["hook"],
            self.registry,
            buckets=HOOK_BUCKETS,
        )
        self._hooked = CounterFamily(
            "runtime_proxy_hooked_calls",
            "CRI calls that went through hooks, by method and outcome.",
            ["method", "outcome"],
            self.registry,
        )
        self._hooked_seconds = HistogramFamily(
            "runtime_proxy_hooked_call_duration_seconds",
            "CRI calls that went through hooks, end to end (hooks and backend).",
            ["method"],
            self.registry,
            buckets=Histogram.DEFAULT_BUCKETS,
        )
        self.backend_up = Gauge(
            "runtime_proxy_backend_ready",
            "1 while the backend is connected and answered a version probe; 0 before and while it is lost.",
            registry=self.registry,
        )
        # A separate image service's (--image-backend): a metric of its own,
        # registered only with one, so the runtime's series stays as it was.
        self.image_backend_up: Gauge | None = None
        self.hook_servers = Gauge(
            "runtime_proxy_hook_servers", "Hook servers registered from the hook directory.", registry=self.registry
        )
        self.hook_config = HookConfigMetrics(self.registry)
        self.hook_stats: dict[str, HookServerStats] = {}  # by hook file name, for `runtime-proxy status`
        self._registered: frozenset[str] | None = None  # the hook files registered (None: not told yet)
        self.cri = CriCallMetrics(self.registry)

    def hook_call(
        self, server: str, hook: str, outcome: str, seconds: float, cause: str | None = None, *,
        caller_cancelled: bool = False,
    ) -> None:
        """One hook call's outcome; ``cause``, a failure's, is kept for `status`
        (``caller_cancelled``: the CRI call was, by kubelet or the proxy's stop:
        counted, but no failure of the server's; see :class:`HookServerStats`)."""
        self._hook_calls.labels(server, hook, outcome).inc()
        self._hook_seconds.labels(hook).observe(seconds)
        stats = self.hook_stats.get(server)
        if stats is None:
            if self._registered is not None and server not in self._registered:
                return  # a call that outlived its file's removal: its stats are gone with it
            stats = self.hook_stats[server] = HookServerStats()
        stats.count(hook, outcome, cause, caller_cancelled=caller_cancelled)

    def image_backend(self) -> Gauge:
        """``runtime_proxy_image_backend_ready``: made at the first call (a
        proxy with a separate image service), 0 until it is connected and has
        a CRI version image calls are sent in."""
        if self.image_backend_up is None:
            self.image_backend_up = Gauge(
                "runtime_proxy_image_backend_ready",
                "1 while the separate image service (--image-backend) is connected, answered an ImageFsInfo probe "
                "and serves a CRI version image calls are sent in; 0 before, while it is lost, and while it has none.",
                registry=self.registry,
            )
        return self.image_backend_up

    def keep_hook_stats(self, names: Iterable[str]) -> None:
        """Forget the stats of hook files no longer registered: one added again
        under the same name starts clean (no last error of its predecessor)."""
        keep = self._registered = frozenset(names)
        for name in [n for n in self.hook_stats if n not in keep]:
            del self.hook_stats[name]

    def hooked_call(self, method: str, outcome: str, seconds: float) -> None:
        self._hooked.labels(method, outcome).inc()
        self._hooked_seconds.labels(method).observe(seconds)

    async def serve(self, address: str, stack: contextlib.ExitStack | contextlib.AsyncExitStack) -> MetricsListener:
        """Serve /metrics on HOST:PORT from a background thread (metricshttp.py:
        a ConfigError for a name that does not resolve or a port in use, a
        warning and metrics later when the resolver does not answer); ``stack``
        stops the listener, without waiting for that thread."""
        return await serve(self.registry, address, stack)


# A failure's cause kept for `status`: a gRPC status's details may be long
# (a hook server's traceback); the proxy's log has each cause whole.
MAX_CAUSE = 500


@dataclass
class HookServerStats:
    """One hook server's calls by outcome, and its last failure: whether it is
    current (no call has succeeded since) or past, and the run of failed calls
    it ended (an operator wants the history, and must not take it for now).

    A call whose CRI call was cancelled (its client gave up, the runtime ended it, or the proxy stops)
    is counted by outcome only: it is no failure of the server's, nor a
    success, as for its outage's log (dispatch.py); it would otherwise start
    or lengthen a run of "failures" of a server that never failed.

    Every other outcome but ``ok`` is a failed call of the run, whatever the
    server did: no answer (``unavailable``, ``deadline_exceeded``), an error
    status answered (``internal``: its handler raised), an answer that is not
    the hook point's message (``invalid_answer``), an answer the proxy
    refused (``invalid_value``), a failure of the proxy's own while it asked
    or judged it (``error``), or no call at all (``untrusted_endpoint``):
    nothing it sent applied, and under ``Fail`` the CRI call was refused, so an
    operator must not read the server as working. The run counts them by
    outcome (``failed_by_outcome``), for `status` to say which it was: each
    sends the operator somewhere else (admin.py)."""

    calls: dict[str, int] = field(default_factory=dict)
    last_error: dict[str, object] | None = None
    failing_since: float | None = None  # the first of the failed calls in a row now; None: the last call succeeded
    failed_in_a_row: int = 0  # of the current run, or of the last one once it ended
    run_outcomes: dict[str, int] = field(default_factory=dict)  # those calls by outcome

    def count(self, hook: str, outcome: str, cause: str | None = None, *, caller_cancelled: bool = False) -> None:
        self.calls[outcome] = self.calls.get(outcome, 0) + 1
        if caller_cancelled:
            return
        if outcome == "ok":  # (nearly every call: no clock read unless it ends a run of failures)
            if self.failing_since is not None and self.last_error is not None:
                self.last_error = {**self.last_error, "current": False, "recovered_at": time.time()}
            self.failing_since = None
            return
        now = time.time()
        if self.failing_since is None:
            self.failing_since, self.failed_in_a_row, self.run_outcomes = now, 0, {}
        self.failed_in_a_row += 1
        self.run_outcomes[outcome] = self.run_outcomes.get(outcome, 0) + 1
        self.last_error = {
            "outcome": outcome, "hook": hook, "at": now, "cause": _cut_cause(cause),
            "current": True,  # no call of the server has succeeded since
            "failing_since": self.failing_since,
            "failed_calls": self.failed_in_a_row,  # in a row, this one included
            "failed_by_outcome": dict(self.run_outcomes),  # those calls by outcome (a copy: the run goes on)
            "recovered_at": None,  # when a call succeeded again
        }


def _cut_cause(cause: str | None) -> str | None:
    if cause is None or len(cause) <= MAX_CAUSE:
        return cause
    return f"{cause[:MAX_CAUSE]}... ({len(cause)} characters, cut; the proxy's log has it whole)"


CRI_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class CriCallMetrics:
    """Every CRI call by method, client version and status code (issue 12).

    Children are bound on first use and kept, so a call costs a dict lookup,
    not a label resolution; series appear only for methods that were called.
    Labels are bounded (``methods.metric_ref``): a method no CRI schema we
    carry has is counted as ``unknown``, since clients may call any name and
    every name would otherwise stay a series for good.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._calls = CounterFamily(
            "runtime_proxy_cri_calls",
            "CRI calls served, by method, client CRI version and gRPC status code.",
            ["method", "version", "code"],
            registry,
        )
        self._seconds = HistogramFamily(
            "runtime_proxy_cri_call_duration_seconds",
            "CRI calls end to end as the proxy serves them (hooks, runtime, streams until they end).",
            ["method", "version"],
            registry,
            buckets=CRI_BUCKETS,
        )
        self.in_flight = Gauge(
            "runtime_proxy_cri_calls_in_flight", "CRI calls being served right now.", registry=registry
        )
        self.served_versions = Gauge(
            "runtime_proxy_served_versions",
            "1 for each CRI version served to clients; mode native (sent on as is) or translated.",
            ["version", "mode"],
            registry=registry,
        )
        self._reconnects = Counter(
            "runtime_proxy_backend_reconnects",
            "Backend connections re-established: kind restarted (a new runtime, probed again) or idle "
            "(the same runtime after an idle disconnect).",
            ["kind"],
            registry=registry,
        )
        self._frames_connections = CounterFamily(
            "runtime_proxy_frames_connections",
            "Client connections the frames data path accepted, by path: relayed (a runtime connection of its own) "
            "or spliced (answered by the proxy's own server while the runtime could not be reached).",
            ["path"],
            registry,
        )
        self._frames_open = Gauge(
            "runtime_proxy_frames_connections_open",
            "Client connections of the frames data path open now, by path: relayed or spliced.",
            ["path"],
            registry=registry,
        )
        # By bounded label pair: one recorder (and its children) per pair,
        # shared by every path labelled so (all invented names among them).
        self._recorders: dict[tuple[str, str], Callable[[str, float], None]] = {}
        self.served = 0  # calls finished, and
        self.active = 0  # calls in flight, for `runtime-proxy status`
        # Read at scrape time: no locked update per call.
        self.in_flight.set_function(lambda: self.active)

    def started(self) -> None:
        self.active += 1

    def recorder(self, ref: MethodRef) -> Callable[[str, float], None]:
        label = metric_ref(ref)
        key = (label.method, label.version.value)
        record = self._recorders.get(key)
        if record is None:
            record = self._recorders[key] = self._new_recorder(*key)
        return record

    def _new_recorder(self, method: str, version: str) -> Callable[[str, float], None]:
        # The label children are looked up once, at a code's first call
        # (labels() locks and builds a key each time: most of a record's cost,
        # and it runs per call; and a series appears only once called).
        children: dict[str, tuple[Count, Observed]] = {}

        def record(code: str, elapsed: float) -> None:
            self.active -= 1
            self.served += 1
            pair = children.get(code)
            if pair is None:
                pair = children[code] = (self._calls.labels(method, version, code), self._seconds.labels(method, version))
            pair[0].inc()
            pair[1].observe(elapsed)

        return record

    def serving(self, routes: Mapping[ApiVersion, str]) -> None:
        """The versions served now (client version -> backend version); none while refusing."""
        self.served_versions.clear()
        for client, target in routes.items():
            self.served_versions.labels(client, "native" if client == target else "translated").set(1)

    def frames_connection(self, path: str, opened: bool) -> None:
        if opened:
            self._frames_connections.labels(path).inc()
            self._frames_open.labels(path).inc()
        else:
            self._frames_open.labels(path).dec()

    def reconnected(self, restarted: bool) -> None:
        self._reconnects.labels("restarted" if restarted else "idle").inc()


class HookConfigMetrics:
    """The hook directory's health: what an operator alerts on (issue 11)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.dir_refused = Gauge(
            "runtime_proxy_hook_dir_refused",
            "1 while the hook directory is refused as unsafe (group/other-writable or not owned by root): "
            "nothing in it is loaded and the last good hook set stays in force.",
            registry=registry,
        )
        self.dir_kept = Gauge(
            "runtime_proxy_hook_dir_kept",
            "1 while the hook directory is not read (unsafe, unreadable, or not a directory: a file in its place "
            "or its path): the last good hook set stays in force and no change of it is loaded.",
            registry=registry,
        )
        self.files_rejected = Gauge(
            "runtime_proxy_hook_files_rejected",
            "Hook files currently rejected (invalid or unsafe); one that was good before keeps its last good version.",
            registry=registry,
        )
