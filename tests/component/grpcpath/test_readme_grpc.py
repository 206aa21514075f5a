"""tests/component/hookrun/test_readme.py on the grpc data path (see conftest.py)."""

from ..hookrun.test_readme import *  # noqa: F403 - the same tests, another start_proxy
