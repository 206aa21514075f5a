"""tests/component/cripath/test_backend_init.py on the frames data path (see conftest.py)."""

from grpc import aio

from ..cripath.test_backend_init import *  # noqa: F403 - the same tests, another start_proxy
from .known import frames_bug

# The client's connection and the health Watch on it must outlive the runtime
# (NOT_SERVING, then SERVING); on frames the runtime's GOAWAY is relayed to the
# client and its connection closed with the runtime's: the Watch ends UNAVAILABLE.
RUNTIME_GONE_ENDS_THE_CLIENTS_CONNECTION = (
    "frames bug: a runtime going away ends the client's connection, the proxy's own calls on it included"
)
test_health_waits_for_a_restarted_runtime_to_initialise = frames_bug(
    test_health_waits_for_a_restarted_runtime_to_initialise,  # noqa: F405
    RUNTIME_GONE_ENDS_THE_CLIENTS_CONNECTION, aio.AioRpcError,
)
