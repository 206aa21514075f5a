"""The hook stage's method table (executor.HOOKED_METHODS)."""

from __future__ import annotations

from runtimeproxy.hookpath.executor import HOOKED_METHODS


def test_only_the_start_and_stop_calls_keep_no_state() -> None:
    """Those may skip the stage when no hook server is registered (frames path)."""
    stateless = {method for method, point in HOOKED_METHODS.items() if not point.keeps_state}
    assert stateless == {"StartContainer", "StopContainer", "StopPodSandbox"}
