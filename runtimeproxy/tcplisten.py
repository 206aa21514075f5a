"""A TCP address the proxy serves on (``metrics-listen``), judged before
anything binds it, and the words for what its bind met.

``check-config`` looks the host up as the bind will (``resolve``: the first
address ``getaddrinfo`` gives is the one serve binds, a link-local IPv6
one with its scope id), bounded in time, then binds that address on port 0:
whether it is this host's. The port itself is not tried: the running proxy
holds its own, and from outside nothing tells it from another process's.
"""

from __future__ import annotations

import errno
import socket
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["LOOKUP_SECONDS", "AddrInfo", "ListenProblem", "check_listen", "error_text", "lookup_error_text", "on_port",
           "resolve"]

AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]

LOOKUP_SECONDS = 2.0  # a resolver this slow at start is a finding of its own
# getaddrinfo's codes (negative on Linux) are not errno values: their own names.
_EAI_NAMES = {getattr(socket, name): name for name in dir(socket) if name.startswith("EAI_")}


@dataclass(frozen=True)
class ListenProblem:
    certain: bool  # serve would fail there; False: the lookup could not say (no answer in time, a resolver down)
    reason: str


def check_listen(host: str, port: int, lookup_seconds: float | None = None) -> ListenProblem | None:
    """What is wrong with serving on ``host``:``port``, as far as can be told
    without taking the port; None: nothing found."""
    lookup_seconds = LOOKUP_SECONDS if lookup_seconds is None else lookup_seconds
    try:
        infos = _lookup(host, port, lookup_seconds)
    except TimeoutError:
        return ListenProblem(False, f"looking up {host!r} gave no answer within {lookup_seconds:g}s (serve "
                                    f"starts without metrics then, and serves them once the name resolves)")
    except socket.gaierror as exc:
        # EAI_AGAIN: the resolver did not answer (down, or no network yet), not that the name is unknown.
        reason = f"{host!r} does not resolve (a lookup): {lookup_error_text(host, exc)}"
        return ListenProblem(exc.errno != socket.EAI_AGAIN, reason)
    except UnicodeError as exc:  # a name the resolver is never asked (IDNA refuses it)
        return ListenProblem(True, f"{host!r} does not resolve: {exc}")
    family, _type, _proto, _name, sockaddr = infos[0]
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind(on_port(sockaddr, 0))  # port 0: whoever holds the port, the proxy included, is left alone
    except OSError as exc:
        shown = repr(host) if sockaddr[0] == host else f"{host!r} ({sockaddr[0]})"
        return ListenProblem(True, f"cannot bind {shown}: {error_text(exc)}")
    return None


def error_text(exc: OSError) -> str:
    """The message of a bind's or lookup's error with its code's name:
    'Address already in use (EADDRINUSE)', 'Name or service not known (EAI_NONAME)'."""
    code = exc.errno
    name = _EAI_NAMES.get(code) if isinstance(exc, socket.gaierror) else errno.errorcode.get(code or 0)
    text = exc.strerror or str(exc)
    return f"{text} ({name})" if name else text


def lookup_error_text(host: str, exc: socket.gaierror) -> str:
    """``error_text``, and for a scoped IPv6 address whose interface does not
    exist, that (getaddrinfo says only EAI_NONAME)."""
    text = error_text(exc)
    _address, percent, scope = host.partition("%")
    if percent and exc.errno == socket.EAI_NONAME and not scope.isdigit():
        try:
            socket.if_nametoindex(scope)
        except (OSError, ValueError):  # ValueError: a NUL in the name, which names no interface either
            return f"{text}: no interface {scope!r} on this host"
    return text


def resolve(host: str, port: int) -> list[AddrInfo]:
    """getaddrinfo as serve's bind takes it: the first address is the one bound."""
    # list(): typeshed's list of its narrower tuples is no list[AddrInfo] (lists are invariant).
    return list(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE))


def on_port(sockaddr: tuple[Any, ...], port: int) -> tuple[Any, ...]:
    """``sockaddr`` with ``port``; an IPv6 one keeps its flow info and scope id
    (without the scope a link-local address cannot be bound: EINVAL)."""
    return (sockaddr[0], port, *sockaddr[2:])


def _lookup(host: str, port: int, seconds: float) -> list[AddrInfo]:
    """``resolve``, given ``seconds``: getaddrinfo has no
    timeout of its own, and a daemon thread left waiting does not hold up exit."""
    answer: list[list[AddrInfo] | OSError | UnicodeError] = []
    done = threading.Event()

    def look_up() -> None:
        try:
            answer.append(resolve(host, port))
        except (OSError, UnicodeError) as exc:
            answer.append(exc)
        finally:
            done.set()

    threading.Thread(target=look_up, name="metrics-listen lookup", daemon=True).start()
    if not done.wait(seconds):
        raise TimeoutError
    if isinstance(answer[0], (OSError, UnicodeError)):
        raise answer[0]
    return answer[0]
