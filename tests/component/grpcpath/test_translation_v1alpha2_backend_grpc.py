"""tests/component/cripath/test_translation_v1alpha2_backend.py on the grpc data path (see conftest.py)."""

from ..cripath.test_translation_v1alpha2_backend import *  # noqa: F403 - the same tests, another start_proxy
