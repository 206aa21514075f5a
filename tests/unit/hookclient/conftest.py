from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    """Where the test's hook server listens."""
    return tmp_path / "hook.sock"
