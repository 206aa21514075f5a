"""tests/component/hookpath/test_hook_order.py on the grpc data path (see conftest.py)."""

from ..hookpath.test_hook_order import *  # noqa: F403 - the same tests, another start_proxy
