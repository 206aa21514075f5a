"""The words for what binding a TCP address the proxy serves on
(``metrics-listen``) met: the error's message and its code's name.
"""

from __future__ import annotations

import errno
import socket

__all__ = ["error_text"]

# getaddrinfo's codes (negative on Linux) are not errno values: their own names.
_EAI_NAMES = {getattr(socket, name): name for name in dir(socket) if name.startswith("EAI_")}


def error_text(exc: OSError) -> str:
    """The message of a bind's or lookup's error with its code's name:
    'Address already in use (EADDRINUSE)', 'Name or service not known (EAI_NONAME)'."""
    code = exc.errno
    name = _EAI_NAMES.get(code) if isinstance(exc, socket.gaierror) else errno.errorcode.get(code or 0)
    text = exc.strerror or str(exc)
    return f"{text} ({name})" if name else text
