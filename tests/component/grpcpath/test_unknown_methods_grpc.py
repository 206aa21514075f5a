"""tests/component/cripath/test_unknown_methods.py on the grpc data path (see conftest.py)."""

from ..cripath.test_unknown_methods import *  # noqa: F403 - the same tests, another start_proxy
