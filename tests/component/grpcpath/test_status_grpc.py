"""tests/component/ops/test_status.py on the grpc data path (see conftest.py)."""

from ..ops.test_status import *  # noqa: F403 - the same tests, another start_proxy
