"""tests/component/cripath/test_pressure.py on the grpc data path (see conftest.py)."""

from ..cripath.test_pressure import *  # noqa: F403 - the same tests, another start_proxy
