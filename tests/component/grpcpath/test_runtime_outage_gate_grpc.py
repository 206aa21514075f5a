"""tests/component/cripath/test_runtime_outage_gate.py on the grpc data path (see conftest.py)."""

from ..cripath.test_runtime_outage_gate import *  # noqa: F403 - the same tests, another data path
