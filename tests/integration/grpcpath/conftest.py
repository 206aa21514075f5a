"""The integration suites of the proxy and real hooks, run again on ``--data-path grpc``."""

from ...component.grpcpath.conftest import grpc_data_path  # noqa: F401 - autouse: every Proxy and serve here is on grpc
