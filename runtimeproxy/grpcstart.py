"""Starting a grpc.aio server so that a cancel leaves it stopped.

grpc's ``AioServer.start`` sets the server RUNNING, creates its serving task
and awaits that task's first step (a future the task resolves). A cancel at
that await cancels the future: the serving task's ``set_result`` then raises
InvalidStateError, grpc logs it as a crash and shuts the server down, and a
``stop`` of ours re-raises it in place of the CancelledError (``serve`` then
logged "fatal" and exited 1, not 0). So the start runs in a task of its own,
shielded from the caller's cancel: a start cancelled or failed waits for it,
then stops the server (its listener must not outlive its socket path's lock)
and raises. The wait never cancels the start, however often the caller is
cancelled meanwhile (``gather`` would pass a second cancel on to it): the
start ends one loop step later anyway.
"""

from __future__ import annotations

import asyncio

from grpc import aio


async def start_server(server: aio.Server) -> None:
    """``server.start()``; when it fails or the caller is cancelled, the server is stopped first."""
    starting = asyncio.ensure_future(server.start())
    try:
        await asyncio.shield(starting)
    except BaseException:
        while not starting.done():
            try:
                await asyncio.wait({starting})
            except asyncio.CancelledError:
                continue  # cancelled again: the first cancel is the one raised below
        await server.stop(None)
        raise
