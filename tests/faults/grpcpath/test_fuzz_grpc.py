"""tests/faults/test_fuzz.py on the grpc data path (see conftest.py)."""

from ..test_fuzz import *  # noqa: F403 - the same tests, every Proxy on the grpc path
