"""Memory the C heaps hold after it was freed is given back to the system."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util

from runtimeproxy.cripath.limits import (
    give_back_freed_memory,
    rss_bytes,
    server_options,
)

MIB = 1 << 20


def test_server_options_bound_the_streams_of_a_connection() -> None:
    options = server_options([("grpc.max_receive_message_length", 1)], 123)
    assert ("grpc.max_concurrent_streams", 123) in options
    assert ("grpc.max_receive_message_length", 1) in options


async def test_freed_memory_the_heap_keeps_is_given_back() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    # As grpc's per-call state: many small blocks, freed all but a few, so
    # that the heap cannot shrink from its top and keeps the pages.
    blocks = [libc.malloc(4000) for _ in range(40_000)]
    for address in blocks:
        ctypes.memset(address, 1, 4000)  # touched: resident
    kept = blocks[-1::-500]
    for address in set(blocks) - set(kept):
        libc.free(address)
    before = rss_bytes()
    trimmer = asyncio.ensure_future(give_back_freed_memory(interval=0.05, growth=0))
    try:
        async with asyncio.timeout(10):
            while rss_bytes() > before - 100 * MIB:
                await asyncio.sleep(0.05)
    finally:
        trimmer.cancel()
        for address in kept:
            libc.free(address)
