"""The fault suites run again on ``--data-path grpc`` (the default is frames)."""

from ...component.grpcpath.conftest import grpc_data_path  # noqa: F401 - autouse: every Proxy and serve here is on grpc
