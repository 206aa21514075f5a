"""Fixtures of every test."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    """No NOTIFY_SOCKET inherited (a run under a Type=notify unit): what a
    test sends systemd goes to the manager it sets up, never the real one."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
