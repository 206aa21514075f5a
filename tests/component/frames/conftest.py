"""The frames data path's own tests: every Proxy and `serve` process here is on
frames, whatever the default."""

from __future__ import annotations

import pytest

from ..datapath import on_data_path


@pytest.fixture(autouse=True)
def frames_data_path(monkeypatch: pytest.MonkeyPatch) -> None:
    on_data_path(monkeypatch, "frames")
