"""tests/integration/test_batchresource.py on the grpc data path (see conftest.py)."""

from ..test_batchresource import *  # noqa: F403 - the same tests, every Proxy on the grpc path
