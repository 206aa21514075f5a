"""tests/component/ops/test_activation.py on the grpc data path: its `serve` processes get
`--data-path grpc` (see conftest.py). Not re-run: the LISTEN_FDS parsing test (no proxy)."""

from ..ops.test_activation import (  # noqa: F401 - the same tests and their fixture
    held,
    test_a_restart_costs_no_call,
    test_serves_on_the_inherited_socket_and_leaves_it_to_systemd,
)
