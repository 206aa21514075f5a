"""tests/integration/test_hooks_real.py on the grpc data path (see conftest.py)."""

from ..test_hooks_real import *  # noqa: F403 - the same tests, every Proxy on the grpc path
