"""tests/faults/test_hook_faults.py on the grpc data path (see conftest.py)."""

from ..test_hook_faults import *  # noqa: F403 - the same tests, every Proxy on the grpc path
