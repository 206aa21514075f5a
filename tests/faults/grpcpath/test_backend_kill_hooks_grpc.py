"""tests/faults/test_backend_kill_hooks.py on the grpc data path (see conftest.py)."""

from ..test_backend_kill_hooks import *  # noqa: F403 - the same tests, every Proxy on the grpc path
