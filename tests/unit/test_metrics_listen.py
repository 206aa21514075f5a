"""metrics-listen at start: the host's lookup bounded in time, a resolver
that is down leaving the proxy to start without metrics and serve them once
the name resolves, no reverse lookup at bind, a scoped link-local address
served (metricshttp.py). The resolver is a stand-in: no real one is waited on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import make_wsgi_app

from runtimeproxy import metricshttp, tcplisten
from runtimeproxy.config import ConfigError
from runtimeproxy.metrics import Metrics
from runtimeproxy.metricshttp import MetricsListener
from runtimeproxy.nri.app import NriPlugin, NriSettings
from ..prerequisites import LINK_LOCAL_ADDRESS, LINK_LOCAL_INTERFACE, in_network_namespace

REAL_GETADDRINFO = socket.getaddrinfo
WAIT = 10  # seconds an expected event may take on a loaded machine
EAI_AGAIN = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")


@dataclass
class Resolver:
    """getaddrinfo's stand-in: answers each call with the next of
    ``answers`` (an exception is raised), each once ``release`` is set."""

    answers: list[BaseException | None]
    release: threading.Event = field(default_factory=threading.Event)
    asked: threading.Event = field(default_factory=threading.Event)  # a call came
    calls: int = 0
    answered: int = 0

    def __call__(self, host: str, port: int, *args: object, **kwargs: object) -> object:
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else None
        self.asked.set()
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
def stack() -> Iterator[contextlib.ExitStack]:
    """Where serve puts the listener's stop, as the app's exit stack: closed after the test."""
    with contextlib.ExitStack() as stops:
        yield stops


def scrape(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=WAIT) as answer:
        return answer.read().decode()


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


async def test_a_resolver_without_an_answer_holds_the_start_only_for_the_lookup_bound_then_metrics_follow(
    resolver: Resolver, stack: contextlib.ExitStack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy")
    listener = await Metrics().serve("metrics.node.example:0", stack)
    assert resolver.asked.wait(WAIT)
    assert (resolver.calls, resolver.answered) == (1, 0)  # serve returned while the lookup still waits
    assert listener.server is None
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage().startswith("metrics-listen: looking up its host gave no answer in time")
    assert (warning.address, warning.lookup_s) == ("metrics.node.example:0", 0.05)
    resolver.release.set()  # the resolver answers at last
    assert listener.serving.wait(WAIT)
    assert listener.server is not None
    port = listener.server.server_port
    assert "runtime_proxy_hook_servers 0.0" in scrape("127.0.0.1", port)
    (serving,) = [r for r in caplog.records if r.getMessage() == "serving metrics"]
    assert (serving.address, serving.bound) == (f"metrics.node.example:{port}", f"127.0.0.1:{port}")


async def test_a_resolver_that_fails_for_now_is_asked_again_and_metrics_served_once_it_answers(
    resolver: Resolver, stack: contextlib.ExitStack, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tcplisten, "LOOKUP_SECONDS", WAIT)  # the failure comes at once: start sees it
    resolver.answers = [EAI_AGAIN] * 2
    resolver.release.set()
    listener = await Metrics().serve("metrics.node.example:0", stack)  # not a ConfigError: the name may be good
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage().startswith("metrics-listen: the resolver failed for now")
    assert warning.error == "Temporary failure in name resolution (EAI_AGAIN)"
    assert listener.serving.wait(WAIT)
    assert resolver.calls == 3
    assert listener.server is not None
    assert "runtime_proxy_hook_servers 0.0" in scrape("127.0.0.1", listener.server.server_port)


async def test_a_start_slow_to_read_the_first_try_logs_it_before_a_later_try_is_logged(
    resolver: Resolver, stack: contextlib.ExitStack, caplog: pytest.LogCaptureFixture
) -> None:
    """A start slow to read the first try's answer (a busy event loop): the
    thread served on a second try and logged it before start logged the
    warning of the first."""
    caplog.set_level(logging.INFO, logger="runtimeproxy")
    resolver.answers = [EAI_AGAIN]
    resolver.release.set()
    listener = MetricsListener("metrics.node.example:0", make_wsgi_app(Metrics().registry))
    listener.start()
    stack.callback(listener.stop)
    listener._first.result(WAIT)  # the first try's answer is there, start has not read it
    listener.serving.wait(0.5)  # time for the next try (after 0.01 s): the thread waits for start
    await listener.started(WAIT)
    assert listener.serving.wait(WAIT)
    assert [r.getMessage().split(";")[0] for r in caplog.records if r.name == metricshttp.__name__] == [
        "metrics-listen: the resolver failed for now", "serving metrics"]  # the start's, the thread's


async def test_a_stop_ends_the_retries_and_a_late_answer_is_not_served(
    resolver: Resolver, stack: contextlib.ExitStack
) -> None:
    listener = await Metrics().serve("metrics.node.example:0", stack)
    assert resolver.asked.wait(WAIT)  # the start is over, the lookup still waits
    listener.stop()  # as the proxy stops: not waiting for the lookup either
    resolver.release.set()
    assert listener.done.wait(WAIT)
    assert resolver.answered == 1  # the answer came, after the stop
    assert listener.server is None and not listener.serving.is_set()
    assert resolver.calls == 1  # not asked again


async def test_a_stop_during_the_backoff_ends_the_thread_at_once(
    resolver: Resolver, stack: contextlib.ExitStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tcplisten, "LOOKUP_SECONDS", WAIT)  # start sees the failure
    monkeypatch.setattr(metricshttp, "RETRY_FIRST_SECONDS", 3600.0)  # the next try only once this wait is over
    resolver.answers = [EAI_AGAIN]
    resolver.release.set()
    listener = await Metrics().serve("metrics.node.example:0", stack)
    listener.stop()
    assert listener.done.wait(WAIT)
    assert resolver.calls == 1


async def test_a_stop_while_serving_closes_the_listener(stack: contextlib.ExitStack) -> None:
    listener = await Metrics().serve("127.0.0.1:0", stack)
    assert listener.server is not None
    port = listener.server.server_port
    assert "runtime_proxy_hook_servers 0.0" in scrape("127.0.0.1", port)
    listener.stop()
    assert listener.done.wait(WAIT)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=WAIT).close()


async def test_a_failure_after_the_bind_closes_the_listener_and_a_stop_does_not_wait_for_it(
    resolver: Resolver, stack: contextlib.ExitStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The socket stayed open, and stop's shutdown waited for ever for a
    serve_forever that never ran."""
    def failing_log(self: MetricsListener, server: metricshttp.MetricsServer) -> None:
        raise RuntimeError("a log that fails")

    shutdowns: list[metricshttp.MetricsServer] = []
    monkeypatch.setattr(MetricsListener, "_log_serving", failing_log)
    monkeypatch.setattr(metricshttp.MetricsServer, "shutdown", lambda self: shutdowns.append(self))
    listener = await Metrics().serve("metrics.node.example:0", stack)  # the lookup's answer comes after the start
    resolver.release.set()
    assert listener.done.wait(WAIT)  # the thread bound, then its log raised
    assert listener.server is not None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", listener.server.server_port), timeout=WAIT).close()
    listener.stop()
    assert shutdowns == []


async def test_a_cancel_while_the_lookup_waits_ends_the_start_at_once_and_stops_the_thread(
    resolver: Resolver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop signal during the start cancels it: the event loop is not held
    up by the lookup's wait, and the listener does not bind later."""
    monkeypatch.setattr(tcplisten, "LOOKUP_SECONDS", 3600.0)
    started: list[MetricsListener] = []
    real_start = MetricsListener.start
    monkeypatch.setattr(MetricsListener, "start", lambda self: started.append(self) or real_start(self))
    with contextlib.ExitStack() as stack:
        start = asyncio.ensure_future(Metrics().serve("metrics.node.example:0", stack))
        assert await asyncio.to_thread(resolver.asked.wait, WAIT)  # the loop runs while the lookup waits
        start.cancel()
        await asyncio.wait([start], timeout=WAIT)
        assert start.cancelled()
    (listener,) = started
    resolver.release.set()  # the answer comes after the stop
    assert listener.done.wait(WAIT)
    assert listener.server is None and not listener.serving.is_set()


@pytest.mark.parametrize("steps", range(5))
async def test_a_cancel_as_the_first_answer_comes_ends_the_start_cancelled(steps: int) -> None:
    """asyncio.wait_for (Python 3.11) returned the answer instead: serve went
    on to bind, nri to register, while its run waited for a task never to end."""
    # Not started: no thread, the test answers for it.
    listener = MetricsListener("metrics.node.example:0", make_wsgi_app(Metrics().registry))
    start = asyncio.ensure_future(listener.started(WAIT))
    for _ in range(2):
        await asyncio.sleep(0)
    with listener._lock:
        listener._first.set_result("Temporary failure in name resolution (EAI_AGAIN)")  # as the thread does
    for _ in range(steps):
        await asyncio.sleep(0)
    if start.cancel():  # not over yet (it returns once the answer reached it)
        await asyncio.wait([start], timeout=WAIT)
        assert start.cancelled()


async def test_a_stop_of_the_nri_plugin_while_the_lookup_waits_ends_its_run_at_once(
    resolver: Resolver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tcplisten, "LOOKUP_SECONDS", 3600.0)
    plugin = NriPlugin(NriSettings(hook_dir=tmp_path, socket_path=tmp_path / "nri.sock",
                                   metrics_listen="metrics.node.example:0"))
    stop = asyncio.Event()
    run = asyncio.ensure_future(plugin.run(stop))
    assert await asyncio.to_thread(resolver.asked.wait, WAIT)
    stop.set()
    await asyncio.wait([run], timeout=WAIT)
    assert run.done() and run.exception() is None
    assert resolver.answered == 0  # ended while the lookup waits, not once it answered


async def test_a_failure_no_try_foresaw_ends_the_start_in_one_error(
    monkeypatch: pytest.MonkeyPatch, stack: contextlib.ExitStack, caplog: pytest.LogCaptureFixture
) -> None:
    """Not the thread's bare traceback, then a start that waits out its bound
    and says the lookup gave no answer."""
    def failing(host: str, port: int) -> object:
        raise ValueError("embedded null byte")

    monkeypatch.setattr(tcplisten, "resolve", failing)
    monkeypatch.setattr(tcplisten, "LOOKUP_SECONDS", WAIT)
    with pytest.raises(ConfigError) as raised:
        await Metrics().serve("metrics.node.example:0", stack)
    assert str(raised.value) == ("metrics-listen 'metrics.node.example:0': cannot serve there: "
                                 "the metrics thread failed: ValueError('embedded null byte')")
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.getMessage() == "metrics not served: the metrics thread failed"
    assert error.exc_info is not None
    assert messages(caplog, logging.WARNING) == []


async def test_a_name_found_unknown_after_the_start_is_logged_and_not_retried(
    resolver: Resolver, stack: contextlib.ExitStack, caplog: pytest.LogCaptureFixture
) -> None:
    resolver.answers = [socket.gaierror(socket.EAI_NONAME, "Name or service not known")]
    listener = await Metrics().serve("metrics.node.example:0", stack)  # the start no longer waits: no ConfigError
    resolver.release.set()
    assert listener.done.wait(WAIT)
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.getMessage() == "metrics not served: the setting's fault; fix it and restart"
    assert error.error == ("metrics-listen 'metrics.node.example:0': cannot serve there: "
                           "Name or service not known (EAI_NONAME)")
    assert resolver.calls == 1


async def test_the_bind_makes_no_reverse_lookup(monkeypatch: pytest.MonkeyPatch, stack: contextlib.ExitStack) -> None:
    """http.server's bind asks getfqdn(host): a reverse lookup with no bound, even of an IP address."""
    asked: list[str] = []
    monkeypatch.setattr(socket, "getfqdn", lambda name="": asked.append(name) or name)
    listener = await Metrics().serve("127.0.0.1:0", stack)
    assert asked == []
    assert listener.server is not None
    assert "runtime_proxy_hook_servers 0.0" in scrape("127.0.0.1", listener.server.server_port)
    assert asked == []  # nor a scrape


async def test_an_ipv6_address_is_bound_in_its_family(stack: contextlib.ExitStack) -> None:
    listener = await Metrics().serve("[::1]:0", stack)
    assert listener.server is not None
    assert listener.server.socket.family == socket.AF_INET6
    assert "runtime_proxy_hook_servers 0.0" in scrape("[::1]", listener.server.server_port)


# Run in a network namespace of its own: prints what the test checks, as JSON.
SERVE_THEN_ASK = """
import asyncio, contextlib, json, socket, sys
from runtimeproxy.metrics import Metrics

async def main(address, client_host):
    async with contextlib.AsyncExitStack() as stack:
        listener = await Metrics().serve(address, stack)
        server = listener.server
        with socket.create_connection((client_host, server.server_port), timeout=10) as client:
            client.sendall(b"GET /metrics HTTP/1.0\\r\\n\\r\\n")
            answer = b"".join(iter(lambda: client.recv(65536), b""))
        print(json.dumps({"bound": server.bound().replace(f":{server.server_port}", ":PORT"),
                          "scope_id": server.server_address[3] if len(server.server_address) > 3 else None,
                          "index": socket.if_nametoindex("%s"),
                          "answer": answer.decode()}))

asyncio.run(main(sys.argv[1], sys.argv[2]))
""" % LINK_LOCAL_INTERFACE


def serve_then_ask(address: str, client_host: str, setup: str = "") -> dict[str, object]:
    return json.loads(in_network_namespace(SERVE_THEN_ASK, setup, args=[address, client_host]))


def test_a_scoped_link_local_address_is_served() -> None:
    """prometheus_client dropped the scope: the bind failed (EINVAL) for an address the setting's form accepts."""
    scoped = f"{LINK_LOCAL_ADDRESS}%{LINK_LOCAL_INTERFACE}"
    seen = serve_then_ask(f"[{scoped}]:0", scoped)
    assert seen["scope_id"] == seen["index"]
    assert seen["bound"] == f"[{scoped}]:PORT"
    assert str(seen["answer"]).startswith("HTTP/1.0 200 OK")
    assert "runtime_proxy_hook_servers 0.0" in str(seen["answer"])


def test_every_address_is_ipv4_ones_too_whatever_bindv6only_says() -> None:
    """[::] in the docs is every address: with net.ipv6.bindv6only=1 an IPv6
    socket takes IPv6 only, unless it says otherwise."""
    seen = serve_then_ask("[::]:0", "127.0.0.1", setup="echo 1 > /proc/sys/net/ipv6/bindv6only")
    assert seen["bound"] == "[::]:PORT"
    assert str(seen["answer"]).startswith("HTTP/1.0 200 OK")
