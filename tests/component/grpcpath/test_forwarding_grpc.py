"""tests/component/cripath/test_forwarding.py on the grpc data path (see conftest.py)."""

from ..cripath.test_forwarding import *  # noqa: F403 - the same tests, another start_proxy
