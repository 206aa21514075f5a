"""Serving /metrics over HTTP (``metrics-listen``) without a lookup that
holds up the proxy's start.

prometheus_client's ``start_http_server`` looks the host up with no time
limit, binds the address without the scope id of a link-local IPv6 one
(EINVAL: never servable), and its server's bind asks ``socket.getfqdn`` for
the address's name, a reverse lookup with no time limit either, for a name
nothing reads. Its WSGI app and server class are kept; the lookup, the bind
and the server's thread are ours:

* the host is looked up in that thread; start awaits the answer for
  ``LOOKUP_SECONDS``, the event loop free meanwhile (a stop signal cancels
  the wait, and the stop already on the caller's exit stack ends the
  thread). A name that does not resolve (EAI_NONAME) or a bind that fails
  (a port in use) in that time is a ConfigError, as before: the setting's
  fault, which ends ``serve`` before it listens.
* no answer in time, or EAI_AGAIN (the resolver is down, not the name
  unknown): a warning, and the proxy starts without metrics; kubelet needs
  the CRI socket more than a scraper needs /metrics. The thread keeps asking,
  with backoff (once start logged its warning: the log's order is true),
  and serves once the name resolves (logged), until stopped.
  If the answer then is the setting's fault, that is logged as an error and
  the proxy serves on without metrics: its start is over.
* the first address of the lookup's is bound (as prometheus_client did),
  ``[::]`` dual-stack whatever net.ipv6.bindv6only says; ``serving metrics``
  logs it (``bound``).
* an exception no try foresaw is logged with its traceback; it ends the
  start as a ConfigError if start still waits.

Only ``/metrics`` answers the metrics (prometheus_client's app answers them on
any path, so a scrape of a mistyped path looked fine); ``/`` answers a line
pointing there, any other path 404, a method other than GET or HEAD 405
(``metrics_only``).

``stop`` ends the retries or the server without waiting for the thread.
The caller's exit stack calls it: ``serve``'s once the CRI server stopped,
``nri``'s once the connection task ended.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import logging
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from . import tcplisten
from .config import ConfigError, parse_host_port

__all__ = ["METRICS_PATH", "RETRY_FIRST_SECONDS", "RETRY_MAX_SECONDS", "MetricsListener", "metrics_only", "serve"]

RETRY_FIRST_SECONDS = 1.0  # the wait after a lookup the resolver did not answer, doubled each time
RETRY_MAX_SECONDS = 60.0

log = logging.getLogger(__name__)


class MetricsServer(ThreadingWSGIServer):
    """prometheus_client's server (a thread per scrape, daemon threads) on
    the address family and sockaddr the lookup gave."""

    server_address: tuple[Any, ...]  # the socket's getsockname(): (host, port) or IPv6's 4-tuple

    def __init__(self, family: socket.AddressFamily, sockaddr: tuple[Any, ...], app: Callable[..., Any]) -> None:
        self.address_family = family  # read by TCPServer.__init__: [::] and the like need AF_INET6
        super().__init__(sockaddr, _QuietHandler)
        self.set_app(app)

    def server_bind(self) -> None:
        # Not HTTPServer.server_bind: its socket.getfqdn(host) is a reverse
        # lookup without a bound, on the address just bound, for SERVER_NAME.
        if self.address_family == socket.AF_INET6 and ipaddress.IPv6Address(self.server_address[0]).is_unspecified:
            # [::] is every address, IPv4 ones too, whatever net.ipv6.bindv6only says.
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[0], self.server_address[1]
        self.setup_environ()

    def bound(self) -> str:
        """The address bound, as HOST:PORT: the first of the lookup's, an IPv6
        one in brackets, a link-local one with its interface ([fe80::1%eth0]:9464)."""
        host, port, *rest = self.server_address
        if self.address_family != socket.AF_INET6:
            return f"{host}:{port}"
        scope_id = rest[1] if len(rest) > 1 else 0
        if scope_id and "%" not in host:
            try:
                host = f"{host}%{socket.if_indextoname(scope_id)}"
            except OSError:  # the interface went away since
                host = f"{host}%{scope_id}"
        return f"[{host}]:{port}"


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """A line on stderr per scrape is noise (prometheus_client's choice too)."""


METRICS_PATH = "/metrics"
# Not a comment line (#...): a scraper pointed at / fails to parse it instead
# of scraping an empty set without a word.
POINTER = b"runtime-proxy: Prometheus metrics are on /metrics\n"
NOT_FOUND = b"404 not found: metrics are on /metrics\n"
NOT_ALLOWED = b"405 method not allowed: GET or HEAD\n"
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def metrics_only(app: WsgiApp) -> WsgiApp:
    """``app`` (prometheus_client's, which answers the metrics on any path and
    405 to HEAD) on ``/metrics`` only, with its query (``name[]=``) and Accept
    handling; ``/`` a 200 pointer to it, as node exporters' landing page (a
    ``curl`` of the bare port learns where to look rather than a 404 that says
    the port is wrong); any other path 404; GET and HEAD only."""
    def answer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        if method not in ("GET", "HEAD"):
            return _plain(start_response, "405 Method Not Allowed", NOT_ALLOWED, method, [("Allow", "GET, HEAD")])
        if path == METRICS_PATH:
            if method == "GET":
                return app(environ, start_response)
            # HEAD: the headers a GET gets, its Content-Length too, without the body.
            status: list[tuple[str, list[tuple[str, str]]]] = []
            body = b"".join(app({**environ, "REQUEST_METHOD": "GET"}, lambda s, h, *_: status.append((s, h))))
            ((code, headers),) = status
            start_response(code, [*headers, ("Content-Length", str(len(body)))])
            return []
        if path == "/":
            return _plain(start_response, "200 OK", POINTER, method)
        return _plain(start_response, "404 Not Found", NOT_FOUND, method)

    return answer


def _plain(start_response: Callable[..., Any], status: str, body: bytes, method: str,
           headers: list[tuple[str, str]] | None = None) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                            *(headers or [])])
    return [] if method == "HEAD" else [body]


class MetricsListener:
    """The thread that looks the host up, binds and serves; ``stop`` ends it
    wherever it is, without waiting for it."""

    def __init__(self, address: str, app: Callable[..., Any]) -> None:
        self.address = address
        self.host, self.port = parse_host_port(address)  # the form config.load checked
        self._app = app
        self._lock = threading.Lock()
        self._stopped = False
        self._detached = False  # start stopped waiting: later outcomes are the thread's to log
        self._first: concurrent.futures.Future[MetricsServer | ConfigError | str] = concurrent.futures.Future()
        self._wake = threading.Event()  # stopped: ends a backoff's wait
        self._taken = threading.Event()  # start took (and logged) the first outcome, or stopped waiting; or a stop
        self.server: MetricsServer | None = None
        self._shutdown_ends_it = False  # serve_forever runs, or is about to: only it ends a shutdown's wait
        self.serving = threading.Event()  # bound and about to serve
        self.done = threading.Event()  # the thread ended: stopped, or nothing to serve

    def start(self) -> None:
        """Start the thread: the lookup, the bind, then the server or the retries."""
        threading.Thread(target=self._run, name="metrics-http", daemon=True).start()

    async def started(self, lookup_seconds: float) -> None:
        """Wait up to ``lookup_seconds`` for the thread's first try, without
        holding up the event loop; a ConfigError if that found the setting at
        fault. A cancel ends the wait at once: the caller's stop ends the thread."""
        waited = False  # stays so on a cancel: nothing to report
        try:
            # Not wait_for: Python 3.11's swallows a cancel that comes as the answer does.
            async with asyncio.timeout(lookup_seconds):
                await asyncio.shield(asyncio.wrap_future(self._first))
            waited = True
        except TimeoutError:
            waited = True
        finally:
            with self._lock:  # logged before the thread's next outcome is: the log's order is true
                outcome = self._first.result() if self._first.done() else None
                self._detached = True
                if waited:
                    self._report(outcome, lookup_seconds)
            self._taken.set()
        if isinstance(outcome, ConfigError):
            raise outcome

    def _report(self, outcome: MetricsServer | ConfigError | str | None, lookup_seconds: float) -> None:
        if outcome is None:
            log.warning("metrics-listen: looking up its host gave no answer in time; starting without metrics, "
                        "served once it resolves", extra={"address": self.address, "lookup_s": lookup_seconds})
        elif isinstance(outcome, str):
            log.warning("metrics-listen: the resolver failed for now; starting without metrics, served once "
                        "the host resolves", extra={"address": self.address, "error": outcome,
                                                    "retry_in_s": RETRY_FIRST_SECONDS})
        elif isinstance(outcome, MetricsServer):
            self._log_serving(outcome)

    def stop(self) -> None:
        """Returns at once: the server's thread notices a shutdown only at its
        next poll (0.5 s), which the event loop must not wait out."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            server = self.server if self._shutdown_ends_it else None  # else the thread closes it, or did
        self._wake.set()  # ends a backoff's wait
        self._taken.set()  # and the wait for start to log the first outcome
        if server is not None:
            threading.Thread(target=server.shutdown, name="metrics-shutdown", daemon=True).start()

    def _run(self) -> None:
        try:
            self._serve()
        except Exception as exc:  # a bug, or an error no try foresaw: said once, not a thread's bare traceback
            log.exception("metrics not served: the metrics thread failed", extra={"address": self.address})
            with self._lock:
                if not self._detached and not self._first.done():  # start is waiting: it ends with this
                    self._first.set_result(self._refused(f"the metrics thread failed: {exc!r}", exc))
        finally:
            self.done.set()

    def _serve(self) -> None:
        delay = RETRY_FIRST_SECONDS
        while True:
            outcome = self._try()
            with self._lock:
                if self._stopped:
                    if isinstance(outcome, MetricsServer):
                        outcome.server_close()
                    return
                # Start is waiting, and for the first try: it reports this outcome (a later
                # try, before start read the first, is the thread's to log).
                told = not self._detached and not self._first.done()
                if told:
                    self._first.set_result(outcome)
                if isinstance(outcome, MetricsServer):
                    self.server = outcome
            if isinstance(outcome, MetricsServer):
                try:
                    if not told:
                        self._log_serving(outcome)
                    self.serving.set()
                    with self._lock:
                        if self._stopped:
                            return
                        self._shutdown_ends_it = True  # stop's shutdown waits for serve_forever: it runs now
                    outcome.serve_forever()  # until stop's shutdown
                finally:
                    outcome.server_close()  # before done: nothing listens once the thread is over
                return
            if isinstance(outcome, ConfigError):
                if not told:  # the start is over: the proxy serves on, without metrics
                    log.error("metrics not served: the setting's fault; fix it and restart",
                              extra={"address": self.address, "error": str(outcome)})
                return
            if told:
                self._taken.wait()  # start logs its warning before the next try can log a later outcome
            else:
                log.debug("metrics-listen: the resolver failed again",
                          extra={"address": self.address, "error": outcome, "retry_in_s": delay})
            if self._wake.wait(delay):
                return
            delay = min(delay * 2, RETRY_MAX_SECONDS)

    def _try(self) -> MetricsServer | ConfigError | str:
        """One lookup (no bound: this thread is the one waiting) and bind."""
        try:
            family, _type, _proto, _name, sockaddr = tcplisten.resolve(self.host, self.port)[0]
        except socket.gaierror as exc:
            if exc.errno == socket.EAI_AGAIN:  # the resolver is down, not the name unknown
                return tcplisten.error_text(exc)
            return self._refused(tcplisten.lookup_error_text(self.host, exc), exc)
        except OSError as exc:
            return self._refused(tcplisten.error_text(exc), exc)
        except UnicodeError as exc:  # a name the resolver is never asked (IDNA refuses it)
            return self._refused(str(exc), exc)
        try:
            return MetricsServer(family, sockaddr, self._app)
        except OSError as exc:  # a port in use, an address not of this host: the setting's fault
            return self._refused(tcplisten.error_text(exc), exc)

    def _refused(self, reason: str, cause: BaseException) -> ConfigError:
        # "Address already in use (EADDRINUSE)", "Name or service not known (EAI_NONAME)"
        error = ConfigError(f"metrics-listen {self.address!r}: cannot serve there: {reason}", key="metrics_listen")
        error.__cause__ = cause
        return error

    def _log_serving(self, server: MetricsServer) -> None:
        host = f"[{self.host}]" if ":" in self.host else self.host
        log.info("serving metrics", extra={"address": f"{host}:{server.server_port}", "bound": server.bound(),
                                           "path": METRICS_PATH})


async def serve(
    registry: CollectorRegistry, address: str, stack: contextlib.ExitStack | contextlib.AsyncExitStack,
    lookup_seconds: float | None = None,
) -> MetricsListener:
    """Serve ``registry`` on ``address`` (HOST:PORT), path /metrics, from a
    daemon thread that ``stack`` stops; waits at most ``lookup_seconds`` (tcplisten.LOOKUP_SECONDS)
    for the host. The stop is on ``stack`` before the wait: a start cut short
    there (a stop signal) stops the thread too."""
    listener = MetricsListener(address, metrics_only(make_wsgi_app(registry)))
    listener.start()
    stack.callback(listener.stop)
    await listener.started(tcplisten.LOOKUP_SECONDS if lookup_seconds is None else lookup_seconds)
    return listener
