"""tests/component/cripath/test_runtime_lost.py on the grpc data path (see conftest.py)."""

from ..cripath.test_runtime_lost import *  # noqa: F403 - the same tests, another data path
