"""The integration suites of the proxy and real hooks, run again on ``--data-path frames``."""

from ...component.frames.conftest import frames_data_path  # noqa: F401 - autouse: every Proxy here is on frames
