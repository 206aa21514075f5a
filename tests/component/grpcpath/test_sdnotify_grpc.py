"""tests/component/ops/test_sdnotify.py on the grpc data path: its `serve` processes get
`--data-path grpc` (see conftest.py). Not re-run: the notify-socket unit test (no proxy)."""

from ..ops.test_sdnotify import (  # noqa: F401 - the same tests and their fixture
    notify,
    test_ready_status_watchdog_and_stopping,
    test_status_follows_the_backend,
)
