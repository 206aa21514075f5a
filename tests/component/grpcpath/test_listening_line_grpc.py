"""tests/component/ops/test_listening_line.py on the grpc data path (see conftest.py)."""

from ..ops.test_listening_line import *  # noqa: F403 - the same test, another start_proxy
