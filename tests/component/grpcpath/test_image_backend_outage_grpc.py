"""tests/component/cripath/test_image_backend_outage.py on the grpc data path (see conftest.py)."""

from ..cripath.test_image_backend_outage import *  # noqa: F403 - the same tests, another data path
