"""``python -m bench headers [--blocks N] [--rounds R]``: what reading a request's header block costs the relay.

The frames path reads each request's ``:path`` out of its HPACK block
(runtimeproxy/frames/hpackpeek.py); how much that costs depends on how the
client encodes its deadline. gRPC clients index each new ``grpc-timeout``
value: grpc-go rounds a deadline up to the microsecond under 100 s (a new
value each call, so each block adds to the table) and to the millisecond
above (kubelet's 2-minute deadline is ``120000m`` every time: the block only
refers to the table); grpc-core rounds more coarsely, and sends its
user-agent after a new value. This times the proxy's reader against hpack's
full decoder on the same blocks, interleaved, and prints microseconds per
block (the fastest round) and their ratio. Before 2b53243 the proxy decoded
every block that adds to the table in full (the first column). No runtime,
no sockets: one process, one core.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import hpack

from runtimeproxy.frames.hpackpeek import HeaderReader

PATH = frozenset({b":path"})
METHODS = ("ListContainers", "ListPodSandbox", "ContainerStatus", "PodSandboxStatus", "Version", "Status",
           "ImageFsInfo", "ListImages", "ExecSync")  # what kubelet calls at rest, in turn
FIELDS = ((":method", "POST"), (":scheme", "http"), (":path", ""), (":authority", "localhost"),
          ("content-type", "application/grpc"), ("user-agent", "grpc-go/1.51.0"), ("te", "trailers"))

Fields = Callable[[int], list[tuple[str, str]]]


def _grpc_go(timeout: Callable[[int], str]) -> Fields:
    return lambda n: [*FIELDS, ("grpc-timeout", timeout(n))]


def _grpc_core(n: int) -> list[tuple[str, str]]:
    *head, agent = [*FIELDS[:5], ("te", "trailers"), ("user-agent", "grpc-python-asyncio/1.85.3")]
    return [*head, ("grpc-timeout", f"{900 - n % 600}m"), agent]


CLIENTS: dict[str, Fields] = {
    "grpc-go, 30 s deadline": _grpc_go(lambda n: f"{29_999_000 - n * 37}u"),
    "grpc-go, 2 min deadline (kubelet)": _grpc_go(lambda n: "120000m"),
    "grpc-core, new deadline values": _grpc_core,
    "grpc-go, no deadline": lambda n: list(FIELDS),
}


def blocks(fields: Fields, count: int) -> list[bytes]:
    """One connection's request blocks, as its client's encoder writes them."""
    encoder = hpack.Encoder()
    out = []
    for n in range(count):
        path = f"/runtime.v1.RuntimeService/{METHODS[n % len(METHODS)]}"
        out.append(encoder.encode([(k, path if k == ":path" else v) for k, v in fields(n)]))
    return out


def read_all(encoded: list[bytes], reader: HeaderReader, peeking: bool) -> float:
    """Seconds to read every block's ``:path`` in order, as the relay does."""
    started = time.perf_counter()
    for block in encoded:
        found = reader.peek(block, PATH) if peeking else None
        if found is None:
            reader.decode(block)
    return time.perf_counter() - started


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench headers", description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=5_000, help="request blocks per client and round [5000]")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the fastest is shown [5]")
    a = p.parse_args(argv)
    if a.blocks < 1 or a.rounds < 1:
        p.error("--blocks and --rounds must be >= 1")
    print(f"reading :path from {a.blocks} request blocks of one connection, fastest of {a.rounds} rounds")
    print(f"{'client':36s} {'full decode':>12s} {'proxy reader':>13s} {'ratio':>7s}")
    for name, fields in CLIENTS.items():
        encoded = blocks(fields, a.blocks)
        full, peek = [], []
        for _ in range(a.rounds):
            full.append(read_all(encoded, HeaderReader(1 << 20, ""), peeking=False))
            peek.append(read_all(encoded, HeaderReader(1 << 20, ""), peeking=True))
        full_us, peek_us = min(full) / a.blocks * 1e6, min(peek) / a.blocks * 1e6
        print(f"{name:36s} {full_us:9.1f} us {peek_us:10.1f} us {peek_us / full_us:6.2f}x")
    return 0
