"""tests/component/ops/test_cri_metrics.py on the grpc data path (see conftest.py)."""

from ..ops.test_cri_metrics import *  # noqa: F403 - the same tests, another start_proxy
