"""tests/component/cripath/test_translation_bytes.py on the grpc data path (see conftest.py)."""

from ..cripath.test_translation_bytes import *  # noqa: F403 - the same tests, another start_proxy
