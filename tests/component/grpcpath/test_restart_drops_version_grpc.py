"""tests/component/cripath/test_restart_drops_version.py on the grpc data path (see conftest.py)."""

from ..cripath.test_restart_drops_version import *  # noqa: F403 - the same tests, another start_proxy
