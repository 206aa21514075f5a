"""tests/component/hookpath/test_hooks.py on the frames data path (see conftest.py)."""

from ..hookpath.test_hooks import *  # noqa: F403 - the same tests, another start_proxy

# Not re-run here: it delays the grpc relay's ``unary`` (which a hooked call
# on the frames path does not use: its request is re-framed on the client's
# own backend connection) and reads the order in which the runtime's grpc
# server took the calls' headers (on the frames path they reach the runtime
# as the client sent them; the request messages follow the stages).
del test_a_stop_reaches_the_runtime_before_the_next_call_on_its_container  # noqa: F821
