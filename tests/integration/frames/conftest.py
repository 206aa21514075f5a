"""The integration suites of the proxy and real hooks, run again on ``--data-path frames``."""

# autouse: every Proxy here, and every `runtimeproxy serve` process, is on frames
from ...component.frames.conftest import frames_data_path, frames_in_serve_processes  # noqa: F401
