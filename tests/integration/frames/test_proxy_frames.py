"""tests/integration/test_proxy.py on the frames data path (see conftest.py)."""

from ..test_proxy import *  # noqa: F403 - the same tests, every Proxy on the frames path
