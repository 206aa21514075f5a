"""tests/integration/test_balloons.py on the grpc data path (see conftest.py)."""

from ..test_balloons import *  # noqa: F403 - the same tests, every Proxy on the grpc path
