"""Calling hook servers over gRPC: the transports the dispatcher chooses from.

``frames`` is the proxy's own HTTP/2 client (``connection.py``, ``pool.py``),
``grpc`` is grpc.aio (``grpcaio.py``); both give the dispatcher the same
``HookTransport``: raw request bytes in, raw answer bytes or ``CallFailed``
out.
"""
