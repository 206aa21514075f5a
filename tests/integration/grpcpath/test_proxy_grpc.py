"""tests/integration/test_proxy.py on the grpc data path (see conftest.py)."""

from ..test_proxy import *  # noqa: F403 - the same tests, every Proxy on the grpc path
