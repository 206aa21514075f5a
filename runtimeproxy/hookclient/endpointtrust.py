"""Whether a hook server's socket may be called: who owns it, where it lives.

Judged when a connection to it is dialled, not when the hook file is read:
the socket may have been replaced since. On the frames transport (pool.py),
which dials itself, that is once per connection: an established connection
stays with the server that was judged when it was dialled, whatever is at
the path later, and the next dial is judged anew. grpc.aio (grpcaio.py)
reconnects behind our back, so there it is judged at every call.

A look at the path then a connect leaves a gap: a socket swapped in at the
judged path in between would be called as the one judged. The frames
transport closes it: once connected it reads who is listening at the other
end (``SO_PEERCRED``) and refuses one listened on by anyone it would not
trust to own the socket (``require_peer``). That is the user that last called listen() on the
socket (Linux sets it at every listen()), not who serves now: a server that
listened as root then dropped privileges, or a socket-activated one that
never calls listen() itself (systemd, as root, did), passes as root,
unprotected by this check. One that calls listen() on the socket it was
handed (asyncio's ``start_unix_server(sock=...)`` does) is judged as its
own user.
grpc.aio cannot: it hands us no socket of the connection it made, so there
the gap stays (one call's look to its connect; docs/hook-files.md).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import stat

from ..host.peercred import peer_credentials
from .transport import Untrusted

__all__ = ["PEER_REMEMBERED_S", "Peer", "SocketSeen", "judge", "judge_peer", "look", "peer_of",
           "require_connected", "require_peer", "require_trusted"]

# How long a remembered listener refuses its socket without a dial (pool.py):
# a server that listens again as a trusted user (a socket-activated one
# restarted) is dialled again within this, while a refused one costs a dial
# per socket at most this often, not one per call. Here, as its refusal says it.
PEER_REMEMBERED_S = 5.0


@dataclasses.dataclass(frozen=True, slots=True)
class SocketSeen:
    """What was at an endpoint's path when it was looked at (symlinks followed)."""

    path: str  # the socket itself: the endpoint, or what its symlink points to
    uid: int  # its owner
    directory: str
    dir_mode: int  # the directory's permission bits
    # An endpoint that is a symlink: the link's own directory and its bits.
    # Whoever can write there can point the link at another socket.
    link_directory: str | None = None
    link_dir_mode: int = 0
    # Which socket it is: another one bound at the path, or this one
    # chowned, compares unequal (the change time tells apart a new socket
    # on an inode number the old one freed).
    dev: int = 0
    ino: int = 0
    changed_ns: int = 0

    @property
    def identity(self) -> tuple[int, int, int]:
        return self.dev, self.ino, self.changed_ns


def look(endpoint: str) -> SocketSeen | None:
    """The socket at ``endpoint`` as it is now; None if there is none to judge
    (a missing socket is not refused here: its connect fails as UNAVAILABLE)."""
    path = endpoint
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):  # judge what is really connected to, and the link
            link_directory = _directory(endpoint)
            link_dir_mode = stat.S_IMODE(os.stat(link_directory).st_mode)
            path = os.path.realpath(path)
            st = os.stat(path)
            directory = os.path.dirname(path)
            dir_mode = stat.S_IMODE(os.stat(directory).st_mode)
            return SocketSeen(path, st.st_uid, directory, dir_mode, link_directory, link_dir_mode,
                              st.st_dev, st.st_ino, st.st_ctime_ns)
        directory = _directory(path)
        dir_mode = stat.S_IMODE(os.stat(directory).st_mode)
    except (OSError, ValueError):
        return None
    return SocketSeen(path, st.st_uid, directory, dir_mode, dev=st.st_dev, ino=st.st_ino, changed_ns=st.st_ctime_ns)


def judge(seen: SocketSeen, owner_uid: int | None) -> str | None:
    """Why the socket ``seen`` must not be called for a hook file owned by
    ``owner_uid``, or None.

    Whoever owns the socket, or can replace it, answers with env and
    annotations for every pod: the socket must be owned by root, the proxy's
    euid or the hook file's owner, in a directory others cannot write to (and
    a symlinked endpoint's link too).
    """
    uid = seen.uid  # trusted: root, the proxy's euid, or the hook file's owner
    if uid != 0 and uid != os.geteuid() and uid != owner_uid:
        owner = f" or the hook file's owner (uid {owner_uid})" if owner_uid not in (None, 0) else ""
        return f"untrusted endpoint: socket {seen.path} is owned by uid {uid}, not root{owner}"
    if seen.dir_mode & stat.S_IWOTH:
        return (
            f"untrusted endpoint: socket directory {seen.directory} is writable by others "
            f"(mode {seen.dir_mode:04o}); anyone could put a socket there"
        )
    if seen.link_directory is not None and seen.link_dir_mode & stat.S_IWOTH:
        return (
            f"untrusted endpoint: the endpoint is a symlink in {seen.link_directory}, which is writable by "
            f"others (mode {seen.link_dir_mode:04o}); anyone could point it at another socket"
        )
    return None


def require_trusted(seen: SocketSeen | None, owner_uid: int | None) -> None:
    """Raise ``Untrusted`` if ``seen`` must not be called for a hook file owned
    by ``owner_uid`` (``judge``); no socket to judge is no refusal."""
    if seen is not None and (reason := judge(seen, owner_uid)) is not None:
        raise Untrusted(reason, seen)


@dataclasses.dataclass(frozen=True, slots=True)
class Peer:
    """The process at the other end of a connected unix socket, as it was when
    it last called listen() on it before the connect (``SO_PEERCRED``): what
    really answers the calls."""

    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    """The peer of a connected unix socket; ``OSError`` if it cannot be read."""
    return Peer(*peer_credentials(sock))


def judge_peer(peer: Peer, owner_uid: int | None, endpoint: str, remembered: bool = False) -> str | None:
    """Why the server ``peer``, connected to at ``endpoint``, must not be
    called for a hook file owned by ``owner_uid``, or None.

    The same users as ``judge`` trusts to own the socket (which it required
    of the judged socket's owner too): root, the proxy's euid, the hook
    file's owner. Anyone else answering is a socket swapped in at the path
    after it was judged, or one listened on by a user not trusted to own it
    (``SO_PEERCRED`` names whoever last called listen(): see the module's
    doc). ``remembered``: ``peer`` is who listened at an earlier connect to
    the same socket, not dialled now; said so, as that server may have died
    since (its pid reused), its socket left behind.
    """
    uid = peer.uid
    if uid in (0, os.geteuid(), owner_uid):
        return None
    owner = f" or the hook file's owner (uid {owner_uid})" if owner_uid not in (None, 0) else ""
    if remembered:
        return (
            f"untrusted endpoint: the server at {endpoint} was pid {peer.pid} (uid {uid}, not root{owner}) "
            f"when last connected, under {PEER_REMEMBERED_S:g} s ago; not dialled again until then unless "
            "its socket changes"
        )
    # SO_PEERCRED gives the uid at listen(): that pid may have changed user, or be gone (reused) since.
    return (
        f"untrusted endpoint: the server connected to at {endpoint}: pid {peer.pid} listened on it as uid {uid}, "
        f"not root{owner}; was the socket replaced after it was checked, or is it listened on by a user "
        "not trusted to own it?"
    )


def require_peer(
    peer: Peer, seen: SocketSeen, owner_uid: int | None, endpoint: str, remembered: bool = False
) -> None:
    """Raise ``Untrusted`` (with ``seen``, the socket judged) if the server
    ``peer`` may not be called for a hook file owned by ``owner_uid``
    (``judge_peer``; ``remembered``: from an earlier connect, not dialled now)."""
    if (reason := judge_peer(peer, owner_uid, endpoint, remembered)) is not None:
        raise Untrusted(reason, seen, peer, remembered)


def require_connected(seen: SocketSeen, peer: Peer, owner_uid: int | None, endpoint: str) -> None:
    """Raise ``Untrusted`` if a connection to ``endpoint``, its socket judged
    as ``seen`` and served by ``peer``, may not be called for a hook file
    owned by ``owner_uid``: the socket (``judge``), then its server."""
    if (reason := judge(seen, owner_uid)) is not None:
        raise Untrusted(reason, seen, peer)
    require_peer(peer, seen, owner_uid, endpoint)


@functools.lru_cache(maxsize=256)
def _directory(endpoint: str) -> str:
    """A socket path's directory (the same string at every call to its server)."""
    return os.path.dirname(endpoint)
