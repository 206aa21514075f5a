"""tests/component/cripath/test_version_strings.py on the grpc data path (see conftest.py)."""

from ..cripath.test_version_strings import *  # noqa: F403 - the same tests, another start_proxy
