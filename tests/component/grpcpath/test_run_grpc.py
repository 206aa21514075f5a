"""tests/component/hookrun/test_run.py on the grpc data path (see conftest.py): the one
test that sends CRI calls through a proxy; the others drive `hook run` processes alone."""

from ..hookrun.conftest import hook_run  # noqa: F401 - the fixture, outside hookrun/
from ..hookrun.test_run import (
    test_noop_is_registered_called_and_deregistered_before_it_stops,  # noqa: F401
)
