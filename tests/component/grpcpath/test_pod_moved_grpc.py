"""tests/component/hookpath/test_pod_moved.py on the grpc data path (see conftest.py)."""

from ..hookpath.test_pod_moved import *  # noqa: F403 - the same tests, another start_proxy
