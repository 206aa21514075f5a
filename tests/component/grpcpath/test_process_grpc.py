"""tests/component/test_process.py on the grpc data path: its `serve` process gets
`--data-path grpc` (see conftest.py). Not re-run: the bad-config test (serve never starts)."""

from ..test_process import test_serve_answers_then_a_stop_signal_removes_socket  # noqa: F401
