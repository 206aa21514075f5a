"""tests/faults/test_proxy_kill.py on the grpc data path (see conftest.py)."""

from ..test_proxy_kill import *  # noqa: F403 - the same tests, every Proxy on the grpc path
