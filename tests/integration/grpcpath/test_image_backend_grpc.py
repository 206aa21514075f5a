"""tests/integration/test_image_backend.py on the grpc data path (see conftest.py)."""

from ..test_image_backend import *  # noqa: F403 - the same tests, every Proxy on the grpc path
