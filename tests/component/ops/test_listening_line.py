"""The proxy's "listening" line says which data path serves: what an operator
checks first when calls behave otherwise than on the other path."""

from __future__ import annotations

import logging

import pytest

from ..fakes import FakeBackend


async def test_the_listening_line_names_the_data_path_that_serves(
    fake: FakeBackend, start_proxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy")
    proxy = await start_proxy(fake.socket)
    serving = "frames" if proxy._frames is not None else "grpc"  # the path chosen, not the one configured
    assert [r.data_path for r in caplog.records if r.getMessage() == "listening"] == [serving]
