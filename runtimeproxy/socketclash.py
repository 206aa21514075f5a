"""``listen`` on a backend's socket: a setting serve and check-config refuse,
which reads its file and flags together to blame the one given (config.py
reads each setting alone)."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from .config import ConfigError, ProxyConfig, file_error, given_in, key_line

__all__ = ["distinct_sockets"]


def distinct_sockets(config: ProxyConfig, config_file: Path | None = None, flags: Collection[str] = ()) -> None:
    """A ConfigError when ``listen`` is the backend's (or image backend's)
    socket: every call would come back to the proxy, which would answer
    UNAVAILABLE while it probes itself for ever. It blames the setting
    given (``flags``: the settings given as flags; the file's are read from
    ``config_file``), with the file and line when the file gave it; one of
    the two given as a flag and the other in the file, the flag (the clash
    is the command line's), its message saying which came from where."""
    # /var/run is /run; a symlink at listen itself is the bind's to refuse (unixsocket.prepare).
    listen = os.path.join(os.path.realpath(config.listen.parent), config.listen.name)
    for key, path in (("backend", config.backend), ("image_backend", config.image_backend)):
        if path is None or os.path.realpath(path) != listen:
            continue
        name = key.replace("_", "-")
        in_file = given_in(config_file)  # read again only for a refusal
        mixed = _one_flag_one_file(("listen", key), in_file, flags)
        if mixed is not None and config_file is not None:
            flag, from_file = mixed
            line = key_line(config_file, from_file)
            value = config.listen if flag == "listen" else path
            raise ConfigError(
                f"--{flag.replace('_', '-')} {value} on the command line is the socket that config file "
                f"{config_file} gives as {from_file.replace('_', '-')}{f' (line {line})' if line else ''}: "
                f"the proxy would forward every call to itself; {name} is the runtime's socket "
                f"(containerd's: {ProxyConfig.backend})", key=flag)
        if key in in_file or key in flags:
            blamed, message = key, (
                f"listen and {name} are the same socket, {config.listen}: the proxy would forward every call "
                f"to itself; {name} is the runtime's socket (containerd's: {ProxyConfig.backend})"
            )
        else:  # the default backend: listen is what was given
            blamed, message = "listen", (
                f"listen {config.listen} is the runtime's own socket ({name}, by default): the proxy would "
                f"forward every call to itself; give the proxy another path and point kubelet at it"
            )
        if config_file is not None and blamed in in_file and blamed not in flags:
            raise file_error(config_file, blamed, message)
        raise ConfigError(message, key=blamed)


def _one_flag_one_file(pair: tuple[str, str], in_file: Collection[str], flags: Collection[str]) -> tuple[str, str] | None:
    """(the flag's setting, the file's) when one of ``pair`` came as a flag and the other from the file only."""
    first, second = pair
    if first in flags and second in in_file and second not in flags:
        return first, second
    if second in flags and first in in_file and first not in flags:
        return second, first
    return None
