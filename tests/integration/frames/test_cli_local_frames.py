"""tests/integration/test_cli_local.py on the frames data path: its `serve` process gets
`--data-path frames` (see conftest.py)."""

from ..test_cli_local import *  # noqa: F403 - the same test, `serve --data-path frames`
