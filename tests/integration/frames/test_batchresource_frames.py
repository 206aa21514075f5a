"""tests/integration/test_batchresource.py on the frames data path (see conftest.py)."""

from ..test_batchresource import *  # noqa: F403 - the same tests, every Proxy on the frames path
