"""The hook stage's method table (executor.HOOKED_METHODS)."""

from __future__ import annotations

from runtimeproxy.hookpath.executor import HOOKED_METHODS


def test_only_the_start_and_stop_calls_keep_no_state() -> None:
    """Those record nothing; with no hook server registered (frames path), the
    others skip the stage too, unrecorded, but for UpdateContainerResources."""
    stateless = {method for method, point in HOOKED_METHODS.items() if not point.keeps_state}
    assert stateless == {"StartContainer", "StopContainer", "StopPodSandbox"}


def test_only_the_resource_update_is_recorded_with_no_hook_server() -> None:
    assert {m for m, point in HOOKED_METHODS.items() if point.executor.recorded_without_hooks} == {
        "UpdateContainerResources"
    }
