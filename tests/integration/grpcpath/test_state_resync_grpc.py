"""tests/integration/test_state_resync.py on the grpc data path (see conftest.py)."""

from ..test_state_resync import *  # noqa: F403 - the same tests, every proxy on grpc
