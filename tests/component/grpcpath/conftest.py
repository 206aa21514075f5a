"""The component suites of the CRI and hook paths, run again on ``--data-path grpc``
(the default is frames): every Proxy and `serve` process a test here starts is on grpc."""

from __future__ import annotations

import pytest

from ..datapath import on_data_path


@pytest.fixture(autouse=True)
def grpc_data_path(monkeypatch: pytest.MonkeyPatch) -> None:
    on_data_path(monkeypatch, "grpc")
