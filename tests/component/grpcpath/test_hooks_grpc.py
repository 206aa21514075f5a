"""tests/component/hookpath/test_hooks.py on the grpc data path (see conftest.py)."""

from ..hookpath.test_hooks import *  # noqa: F403 - the same tests, another start_proxy

