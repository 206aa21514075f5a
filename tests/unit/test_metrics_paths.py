"""The metrics listener answers the metrics on /metrics only (with
prometheus_client's query and Accept handling), a pointer to it on /, 404 on
any other path and 405 to a method other than GET or HEAD (metricshttp.py's
metrics_only). Over HTTP, to a real listener: the one `serve` and `nri` start."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import http.client
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from runtimeproxy.metrics import Metrics

WAIT = 10  # seconds an answer may take on a loaded machine


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class Client:
    port: int

    async def ask(self, method: str, path: str, headers: dict[str, str] | None = None) -> Answer:
        return await asyncio.to_thread(self._ask, method, path, headers or {})

    def _ask(self, method: str, path: str, headers: dict[str, str]) -> Answer:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
        try:
            connection.request(method, path, headers=headers)
            response = connection.getresponse()
            return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
        finally:
            connection.close()


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    metrics = Metrics()
    metrics.hook_servers.set(3)
    with contextlib.ExitStack() as stack:
        listener = await metrics.serve("127.0.0.1:0", stack)
        assert listener.server is not None
        yield Client(listener.server.server_port)


async def test_metrics_are_served_on_metrics(client: Client) -> None:
    answer = await client.ask("GET", "/metrics")
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("text/plain; version=")
    assert b"\nruntime_proxy_hook_servers 3.0\n" in answer.body
    assert b"runtime_proxy_backend_ready" in answer.body


@pytest.mark.parametrize("path", ["/foo", "/metrics/x", "/metrics/", "/metricsx", "/favicon.ico",
                                  "/foo?name[]=runtime_proxy_hook_servers"])
async def test_any_other_path_is_404_with_a_short_body(client: Client, path: str) -> None:
    """prometheus_client's app answered the metrics on each (an empty 200 on /favicon.ico)."""
    answer = await client.ask("GET", path)
    assert (answer.status, answer.body) == (404, b"404 not found: metrics are on /metrics\n")
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"


async def test_the_root_points_to_metrics_in_a_line_no_scraper_takes_for_an_empty_set(client: Client) -> None:
    answer = await client.ask("GET", "/")
    assert (answer.status, answer.body) == (200, b"runtime-proxy: Prometheus metrics are on /metrics\n")
    assert not answer.body.startswith(b"#")  # a comment line would parse as an exposition without samples


@pytest.mark.parametrize(("method", "path"), [("POST", "/metrics"), ("PUT", "/"), ("OPTIONS", "/metrics"),
                                              ("DELETE", "/foo")])
async def test_a_method_other_than_get_or_head_is_405(client: Client, method: str, path: str) -> None:
    answer = await client.ask(method, path)
    assert (answer.status, answer.body) == (405, b"405 method not allowed: GET or HEAD\n")
    assert answer.headers["allow"] == "GET, HEAD"


async def test_head_of_metrics_has_the_get_s_headers_and_no_body(client: Client) -> None:
    """prometheus_client's app answered HEAD 405."""
    got, head = await client.ask("GET", "/metrics"), await client.ask("HEAD", "/metrics")
    assert (head.status, head.body) == (200, b"")
    assert head.headers["content-type"] == got.headers["content-type"]
    assert int(head.headers["content-length"]) == len(got.body)


@pytest.mark.parametrize(("path", "status"), [("/", 200), ("/foo", 404)])
async def test_head_elsewhere_answers_the_status_without_a_body(client: Client, path: str, status: int) -> None:
    answer = await client.ask("HEAD", path)
    assert (answer.status, answer.body) == (status, b"")
    assert int(answer.headers["content-length"]) > 0  # the GET's body length


async def test_a_name_query_on_metrics_restricts_the_families(client: Client) -> None:
    answer = await client.ask("GET", "/metrics?name[]=runtime_proxy_hook_servers")
    assert answer.status == 200
    samples = [line for line in answer.body.decode().splitlines() if not line.startswith("#")]
    assert samples == ["runtime_proxy_hook_servers 3.0"]


async def test_openmetrics_and_gzip_on_metrics_are_prometheus_client_s(client: Client) -> None:
    answer = await client.ask("GET", "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0",
                                                  "Accept-Encoding": "gzip"})
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("application/openmetrics-text")
    assert answer.headers["content-encoding"] == "gzip"
    text = gzip.decompress(answer.body).decode()
    assert "\nruntime_proxy_hook_servers 3.0\n" in text and text.endswith("# EOF\n")


async def test_head_of_metrics_with_gzip_has_the_gzip_get_s_headers_and_no_body(client: Client) -> None:
    gzipped = {"Accept-Encoding": "gzip"}
    got, head = await client.ask("GET", "/metrics", gzipped), await client.ask("HEAD", "/metrics", gzipped)
    assert got.headers["content-encoding"] == "gzip"
    assert (head.status, head.body) == (200, b"")
    assert head.headers["content-encoding"] == "gzip"
    assert int(head.headers["content-length"]) == len(got.body)


@pytest.mark.parametrize("path", ["//metrics", "/%6Detrics", "/%6d%65trics"])
async def test_a_leading_double_slash_and_percent_encoded_forms_of_metrics_serve_the_metrics(
    client: Client, path: str,
) -> None:
    """As docs/metrics.md says: http.server collapses a leading // and the path is percent-decoded."""
    answer = await client.ask("GET", path)
    assert answer.status == 200 and b"\nruntime_proxy_hook_servers 3.0\n" in answer.body
