"""tests/faults/test_backend_kill.py on the grpc data path (see conftest.py)."""

from ..test_backend_kill import *  # noqa: F403 - the same tests, every Proxy on the grpc path
