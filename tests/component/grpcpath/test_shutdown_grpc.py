"""tests/component/test_shutdown.py on the grpc data path (see conftest.py)."""

from ..test_shutdown import *  # noqa: F403 - the same tests, another start_proxy
