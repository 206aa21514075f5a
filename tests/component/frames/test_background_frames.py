"""tests/component/cripath/test_background.py on the frames data path (see conftest.py)."""

from grpc import aio

from ..cripath.test_background import *  # noqa: F403 - the same tests, another start_proxy
from .known import frames_bug
from .test_backend_init_frames import RUNTIME_GONE_ENDS_THE_CLIENTS_CONNECTION

# Both watch health across a runtime replaced under the proxy.
test_a_listener_failing_in_a_probe_does_not_stop_the_monitor = frames_bug(
    test_a_listener_failing_in_a_probe_does_not_stop_the_monitor,  # noqa: F405
    RUNTIME_GONE_ENDS_THE_CLIENTS_CONNECTION, aio.AioRpcError,
)
test_a_dead_monitor_is_restarted_and_routing_and_health_follow = frames_bug(
    test_a_dead_monitor_is_restarted_and_routing_and_health_follow,  # noqa: F405
    RUNTIME_GONE_ENDS_THE_CLIENTS_CONNECTION, aio.AioRpcError,
)
