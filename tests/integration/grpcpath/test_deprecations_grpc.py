"""tests/integration/test_deprecations.py on the grpc data path (see conftest.py)."""

from ..test_deprecations import *  # noqa: F403 - the same tests, every Proxy on the grpc path
