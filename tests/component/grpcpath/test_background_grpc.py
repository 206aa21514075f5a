"""tests/component/cripath/test_background.py on the grpc data path (see conftest.py)."""

from ..cripath.test_background import *  # noqa: F403 - the same tests, another start_proxy
