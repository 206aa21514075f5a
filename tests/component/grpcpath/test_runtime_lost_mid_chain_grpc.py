"""tests/component/hookpath/test_runtime_lost_mid_chain.py on the grpc data path (see conftest.py)."""

from ..hookpath.test_runtime_lost_mid_chain import *  # noqa: F403 - the same tests, another data path
