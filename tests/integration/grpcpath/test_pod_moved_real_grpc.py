"""tests/integration/test_pod_moved_real.py on the grpc data path."""

from ..test_pod_moved_real import *  # noqa: F403 - the same tests, another data path
