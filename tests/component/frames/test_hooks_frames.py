"""tests/component/hookpath/test_hooks.py on the frames data path (see conftest.py)."""

from ..hookpath.test_hooks import *  # noqa: F403 - the same tests, another start_proxy

# Not re-run here: it asserts the exact list of calls the runtime's grpc
# server saw, and on the frames path a diverted call's header block also
# reaches the runtime (followed at once by RST_STREAM, before any request
# message: no handler runs), so that list carries one more entry per
# diverted call. The ordering it checks is the hook stage's, unchanged.
del test_a_stop_reaches_the_runtime_before_the_next_call_on_its_container  # noqa: F821
