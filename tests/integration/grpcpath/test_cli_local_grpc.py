"""tests/integration/test_cli_local.py on the grpc data path: its `serve` process gets
`--data-path grpc` (see conftest.py)."""

from ..test_cli_local import *  # noqa: F403 - the same test, `serve --data-path grpc`
