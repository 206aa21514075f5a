"""tests/component/cripath/test_wire_answers.py on the grpc data path (see conftest.py)."""

from ..cripath.test_wire_answers import *  # noqa: F403 - the same tests, another start_proxy
