"""`runtime-proxy nri` refuses what it could not serve, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from runtimeproxy import cli

# The command sets the root logger up (logs.setup: INFO, its own handler): put back after each test.
pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.mark.parametrize("address", ["localhost", "::1:9464", "host:70000", "host:", "*:9464"])
def test_a_bad_metrics_address_is_one_clear_line(tmp_path: Path, address: str) -> None:
    result = CliRunner().invoke(
        cli.main, ["nri", "--hook-dir", str(tmp_path), "--nri-socket", str(tmp_path / "nri.sock"), "--metrics-listen", address]
    )
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: --metrics-listen '{address}'"), result.output
    assert "Traceback" not in result.output
