"""Whether a hook server's socket may be called: who owns it, where it lives.

Judged at every call (dispatch.py), not when the hook file is read: the socket
may have been replaced since.
"""

from __future__ import annotations

import functools
import os
import stat

from .hookfile import HookServerConfig

__all__ = ["untrusted_reason"]


def untrusted_reason(server: HookServerConfig) -> str | None:
    """Why ``server``'s socket must not be called, or None.

    Whoever owns the socket, or can replace it, answers with env and
    annotations for every pod: the socket must be owned by root, the proxy's
    euid or the hook file's owner, in a directory others cannot write to.
    A missing socket is not refused here: the call fails as UNAVAILABLE.
    """
    path = server.endpoint
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):  # judge what is really connected to
            path = os.path.realpath(path)
            st = os.stat(path)
            directory = os.path.dirname(path)
        else:
            directory = _directory(path)
        dir_mode = stat.S_IMODE(os.stat(directory).st_mode)
    except (OSError, ValueError):
        return None
    uid = st.st_uid  # trusted: root, the proxy's euid, or the hook file's owner
    if uid != 0 and uid != os.geteuid() and uid != server.owner_uid:
        owner = f" or the hook file's owner (uid {server.owner_uid})" if server.owner_uid not in (None, 0) else ""
        return f"untrusted endpoint: socket {path} is owned by uid {st.st_uid}, not root{owner}"
    if dir_mode & stat.S_IWOTH:
        return (
            f"untrusted endpoint: socket directory {directory} is writable by others (mode {dir_mode:04o}); "
            "anyone could put a socket there"
        )
    return None


@functools.lru_cache(maxsize=256)
def _directory(endpoint: str) -> str:
    """A socket path's directory (the same string at every call to its server)."""
    return os.path.dirname(endpoint)
