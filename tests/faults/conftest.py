"""The fault suite: the proxy under the faults an operator's worst day brings.

Tests here reuse the integration tier (a real, private containerd per test:
these tests kill it) and the component tier (the fake backend, for faults a
real runtime cannot show). Tests that run containerd are marked `integration`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# The component tier's fake backend and socket directory.
# A proxy with every feature (build_proxy) on the fake backend, and its hook directory.
from ..component.conftest import client, fake, hook_dir, running, sock_dir, start_proxy  # noqa: F401  # noqa: F401

# The integration tier's own containerd (started and killed by the test) and pod log directory.
from ..integration.conftest import own_containerd, pod_log_dir  # noqa: F401

_REAL_RUNTIME = ("test_backend_kill.py", "test_backend_kill_hooks.py", "test_proxy_kill.py",
                 "test_stateful_hook_restart.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if item.path.parent == here and item.path.name in _REAL_RUNTIME:
            item.add_marker(pytest.mark.integration)
