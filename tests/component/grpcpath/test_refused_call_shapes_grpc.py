"""tests/component/cripath/test_refused_call_shapes.py on the grpc data path (see conftest.py)."""

from ..cripath.test_refused_call_shapes import *  # noqa: F403 - the same tests, another start_proxy
