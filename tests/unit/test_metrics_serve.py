"""What only the metrics bind can find (a host that does not resolve, a port
in use) is a ConfigError naming metrics-listen and the error's code in one
line: serve logs it as such (cli._operator_errors), without a traceback."""

from __future__ import annotations

import contextlib
import socket

import pytest

from runtimeproxy.config import ConfigError
from runtimeproxy.metrics import Metrics


async def test_a_host_that_does_not_resolve_is_one_line_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    def unknown(*args: object, **kwargs: object) -> object:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)  # no resolver asked: the answer a missing name gets
    with pytest.raises(ConfigError) as raised:
        await Metrics().serve("node-9.invalid:0", contextlib.ExitStack())
    assert str(raised.value) == "metrics-listen 'node-9.invalid:0': cannot serve there: Name or service not known (EAI_NONAME)"
    assert raised.value.key == "metrics_listen"


async def test_a_port_in_use_is_one_line_naming_the_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ConfigError) as raised:
            await Metrics().serve(address, contextlib.ExitStack())
    assert str(raised.value) == f"metrics-listen '{address}': cannot serve there: Address already in use (EADDRINUSE)"


async def test_a_scope_naming_no_interface_says_so() -> None:
    with pytest.raises(ConfigError) as raised:
        await Metrics().serve("[fe80::1%nosuchif0]:0", contextlib.ExitStack())
    assert str(raised.value) == ("metrics-listen '[fe80::1%nosuchif0]:0': cannot serve there: "
                                 "Name or service not known (EAI_NONAME): no interface 'nosuchif0' on this host")
