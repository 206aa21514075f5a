"""tests/component/ops/test_cri_metrics.py on the frames data path (see conftest.py)."""

from ..ops.test_cri_metrics import *  # noqa: F403 - the same tests, another start_proxy
from .known import frames_bug

# Calls relayed frame by frame are not counted at all (runtime_proxy_cri_calls_total,
# the duration histogram, runtime_proxy_cri_calls_in_flight, `status`'s calls
# served): only diverted calls reach the grpc.aio handlers that count.
test_calls_counted_by_method_version_and_code = frames_bug(
    test_calls_counted_by_method_version_and_code,  # noqa: F405
    "frames bug: relayed calls are missing from the CRI call metrics", AssertionError,
)
