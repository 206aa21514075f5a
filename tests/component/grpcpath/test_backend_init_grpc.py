"""tests/component/cripath/test_backend_init.py on the grpc data path (see conftest.py)."""

from ..cripath.test_backend_init import *  # noqa: F403 - the same tests, another start_proxy
