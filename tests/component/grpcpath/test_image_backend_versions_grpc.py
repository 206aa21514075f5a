"""tests/component/cripath/test_image_backend_versions.py on the grpc data path (see conftest.py)."""

from ..cripath.test_image_backend_versions import *  # noqa: F403 - the same tests, another data path
