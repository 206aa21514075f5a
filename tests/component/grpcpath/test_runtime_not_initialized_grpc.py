"""tests/component/cripath/test_runtime_not_initialized.py on the grpc data path (see conftest.py)."""

from ..cripath.test_runtime_not_initialized import *  # noqa: F403 - the same tests, another data path
