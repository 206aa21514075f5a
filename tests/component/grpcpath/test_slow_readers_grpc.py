"""tests/component/cripath/test_slow_readers.py on the grpc data path (see conftest.py)."""

from ..cripath.test_slow_readers import *  # noqa: F403 - the same tests, another start_proxy
