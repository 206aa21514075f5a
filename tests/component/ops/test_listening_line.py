"""The proxy's "listening" line says which data path serves: what an operator
checks first when calls behave otherwise than on the other path; and the
socket's mode, as ls and the docs write it."""

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


async def test_the_listening_line_gives_the_mode_as_the_docs_write_it(
    fake: FakeBackend, start_proxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy")
    await start_proxy(fake.socket)
    assert [r.mode for r in caplog.records if r.getMessage() == "listening"] == ["0660"]  # not Python's 0o660
