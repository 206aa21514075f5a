"""The gRPC channel options of the proxy's server and of its runtime channels."""

from __future__ import annotations

# The channel's longest wait between two connection attempts while the runtime
# is away (grpc adds up to 20 % jitter). Python's grpc cannot reset a
# channel's backoff, so once the runtime is back, hooked calls (refused by the
# outage gate meanwhile) and the probe wait up to this long for the next
# attempt. A failed connect() on a Unix socket costs microseconds.
RECONNECT_MAX_S = 0.5
# kubelet's and containerd's (Go grpc) header-list limit: metadata the
# runtime accepts must pass the proxy too (grpc core's own default is 8 KiB).
MAX_METADATA_BYTES = 16 << 20


def channel_options(max_recv: int, max_send: int) -> list[tuple[str, int | str]]:
    """Options of the proxy's server and of its backend channels."""
    return [
        ("grpc.max_receive_message_length", max_recv),
        ("grpc.max_send_message_length", max_send),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
        # Unix sockets: reconnect quickly after a runtime restart.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", int(RECONNECT_MAX_S * 1000)),
    ]
