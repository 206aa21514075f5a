"""tests/component/hookpath/test_hook_records.py on the grpc data path (see conftest.py)."""

from ..hookpath.test_hook_records import *  # noqa: F403 - the same tests, another start_proxy
