"""tests/component/cripath/test_translation_app.py on the grpc data path (see conftest.py)."""

from ..cripath.test_translation_app import *  # noqa: F403 - the same tests, another start_proxy
