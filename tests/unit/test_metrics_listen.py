"""metrics-listen at start: the host's lookup bounded in time, a resolver
that is down leaving the proxy to start without metrics and serve them once
the name resolves, no reverse lookup at bind, a scoped link-local address
served (metricshttp.py). The resolver is a stand-in: no real one is waited on."""

from __future__ import annotations

import logging
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from runtimeproxy import metricshttp, tcplisten
from runtimeproxy.metrics import Metrics
from runtimeproxy.metricshttp import MetricsListener
from ..prerequisites import link_local_address

REAL_GETADDRINFO = socket.getaddrinfo
WAIT = 10  # seconds an expected event may take on a loaded machine


@dataclass
class Resolver:
    """getaddrinfo's stand-in: answers each call with the next of
    ``answers`` (an exception is raised), each once ``release`` is set."""

    answers: list[BaseException | None]
    release: threading.Event = field(default_factory=threading.Event)
    calls: int = 0
    answered: int = 0

    def __call__(self, host: str, port: int, *args: object, **kwargs: object) -> object:
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else None
        self.release.wait(WAIT)  # bounded: the code before the fix waits here as long as this
        self.answered += 1
        if answer is not None:
            raise answer
        return REAL_GETADDRINFO("127.0.0.1", port, *args, **kwargs)  # the name resolves to loopback


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Resolver]:
    stand_in = Resolver([])
    monkeypatch.setattr(socket, "getaddrinfo", stand_in)
    monkeypatch.setattr(tcplisten, "LOOKUP_SECONDS", 0.05)
    monkeypatch.setattr(metricshttp, "RETRY_FIRST_SECONDS", 0.01)
    yield stand_in
    stand_in.release.set()


@pytest.fixture
def listeners() -> Iterator[Callable[[MetricsListener], MetricsListener]]:
    started: list[MetricsListener] = []
    yield lambda listener: started.append(listener) or listener
    for listener in started:
        listener.stop()


def scrape(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=WAIT) as answer:
        return answer.read().decode()


def test_a_resolver_without_an_answer_holds_the_start_only_for_the_lookup_bound_then_metrics_follow(
    resolver: Resolver, listeners: Callable[[MetricsListener], MetricsListener], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy")
    listener = listeners(Metrics().serve("metrics.node.example:0"))
    assert (resolver.calls, resolver.answered) == (1, 0)  # serve returned while the lookup still waits
    assert listener.server is None
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage().startswith("metrics-listen: looking up its host gave no answer in time")
    assert (warning.address, warning.lookup_s) == ("metrics.node.example:0", 0.05)
    resolver.release.set()  # the resolver answers at last
    assert listener.serving.wait(WAIT)
    assert listener.server is not None
    assert "runtime_proxy_hook_servers 0.0" in scrape("127.0.0.1", listener.server.server_port)
    assert "serving metrics" in [r.getMessage() for r in caplog.records]


def test_a_resolver_that_fails_for_now_is_asked_again_and_metrics_served_once_it_answers(
    resolver: Resolver, listeners: Callable[[MetricsListener], MetricsListener], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tcplisten, "LOOKUP_SECONDS", WAIT)  # the failure comes at once: start sees it
    resolver.answers = [socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")] * 2
    resolver.release.set()
    listener = listeners(Metrics().serve("metrics.node.example:0"))  # not a ConfigError: the name may be good
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage().startswith("metrics-listen: the resolver failed for now")
    assert warning.error == "Temporary failure in name resolution (EAI_AGAIN)"
    assert listener.serving.wait(WAIT)
    assert resolver.calls == 3
    assert listener.server is not None
    assert "runtime_proxy_hook_servers 0.0" in scrape("127.0.0.1", listener.server.server_port)


def test_a_stop_ends_the_retries_and_a_late_answer_is_not_served(resolver: Resolver) -> None:
    listener = Metrics().serve("metrics.node.example:0")
    assert resolver.answered == 0  # the start is over, the lookup still waits
    listener.stop()  # as the proxy stops: not waiting for the lookup either
    assert resolver.answered == 0
    resolver.release.set()
    assert listener.done.wait(WAIT)
    assert listener.server is None and not listener.serving.is_set()
    assert resolver.calls == 1  # not asked again


def test_a_name_found_unknown_after_the_start_is_logged_and_not_retried(
    resolver: Resolver, caplog: pytest.LogCaptureFixture
) -> None:
    resolver.answers = [socket.gaierror(socket.EAI_NONAME, "Name or service not known")]
    listener = Metrics().serve("metrics.node.example:0")  # the start no longer waits: no ConfigError to raise
    resolver.release.set()
    assert listener.done.wait(WAIT)
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.getMessage() == "metrics not served: the setting's fault; fix it and restart"
    assert error.error == ("metrics-listen 'metrics.node.example:0': cannot serve there: "
                           "Name or service not known (EAI_NONAME)")
    assert resolver.calls == 1


def test_the_bind_makes_no_reverse_lookup(
    monkeypatch: pytest.MonkeyPatch, listeners: Callable[[MetricsListener], MetricsListener]
) -> None:
    """http.server's bind asks getfqdn(host): a reverse lookup with no bound, even of an IP address."""
    asked: list[str] = []
    monkeypatch.setattr(socket, "getfqdn", lambda name="": asked.append(name) or name)
    listener = listeners(Metrics().serve("127.0.0.1:0"))
    assert asked == []
    assert listener.server is not None
    assert "runtime_proxy_hook_servers 0.0" in scrape("127.0.0.1", listener.server.server_port)
    assert asked == []  # nor a scrape


def test_an_ipv6_address_is_bound_in_its_family(listeners: Callable[[MetricsListener], MetricsListener]) -> None:
    listener = listeners(Metrics().serve("[::1]:0"))
    assert listener.server is not None
    assert listener.server.socket.family == socket.AF_INET6
    assert "runtime_proxy_hook_servers 0.0" in scrape("[::1]", listener.server.server_port)


def test_a_scoped_link_local_address_is_served(listeners: Callable[[MetricsListener], MetricsListener]) -> None:
    """prometheus_client dropped the scope: the bind failed (EINVAL) for an address the setting's form accepts."""
    address, interface = link_local_address()
    listener = listeners(Metrics().serve(f"[{address}%{interface}]:0"))
    assert listener.server is not None
    assert listener.server.server_address[3] == socket.if_nametoindex(interface)
    with socket.create_connection((f"{address}%{interface}", listener.server.server_port), timeout=WAIT) as client:
        client.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        answer = b"".join(iter(lambda: client.recv(65536), b""))
    assert answer.startswith(b"HTTP/1.0 200 OK")
    assert b"runtime_proxy_hook_servers 0.0" in answer
