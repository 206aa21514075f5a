"""tests/component/cripath/test_message_limits.py on the grpc data path (see conftest.py)."""

from ..cripath.test_message_limits import *  # noqa: F403 - the same tests, another start_proxy
