"""The frames data path's own tests: every Proxy and `serve` process here is on
frames, whatever the default."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from ..datapath import on_data_path


@pytest.fixture(autouse=True)
def frames_data_path(monkeypatch: pytest.MonkeyPatch) -> None:
    on_data_path(monkeypatch, "frames")


@pytest.fixture
def temp_root(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """mkdtemp's directory (TMPDIR) for this test alone, as other runs share /tmp:
    for in-process proxies, and `serve` processes given it as TMPDIR."""
    root = sock_dir / "t"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root
