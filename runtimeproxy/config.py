"""Proxy settings: defaults, then the YAML file, then command-line flags."""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import re
import socket
from dataclasses import dataclass, field
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .cripath.backend import CRI_VERSIONS
from .cripath.versions import VersionPlanError, parse_serve_versions
from . import yamlkeys
from .host import unixsocket
from .endpointurl import EndpointURLError, endpoint_path
from .eventloop import EVENT_LOOPS
from .shown import shown

MIB = 1024 * 1024
# How serve_versions is written (checked by cripath.versions.parse_serve_versions).
SERVE_VERSIONS_FORMS = ("auto", "v1", "v1alpha2", "v1,v1alpha2")


class ConfigError(ValueError):
    """A bad setting; ``line`` is where it is in the config file (1-based) when known."""

    def __init__(self, message: str, *, key: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.key = key  # the setting at fault, as a ProxyConfig field name
        self.line = line


@dataclass(frozen=True)
class ProxyConfig:
    listen: Path = Path("/var/run/runtime-proxy/runtime-proxy.sock")
    # None only as built in code before a backend is known (a null in the file
    # is this default; --local-containerd sets its own).
    backend: Path | None = Path("/run/containerd/containerd.sock")
    image_backend: Path | None = None  # None: same as backend
    hook_dir: Path = Path("/etc/runtime/hookserver.d")
    serve_versions: str = "auto"  # one of SERVE_VERSIONS_FORMS
    # None: v1 when the backend answers v1
    backend_version: str | None = field(default=None, metadata={"choices": ("v1", "v1alpha2")})
    # v1 requests for a v1alpha2 runtime carrying fields newer than our schema.
    unknown_fields: str = field(default="refuse", metadata={"choices": ("refuse", "forward")})
    max_recv_message_bytes: int = 16 * MIB  # kubelet's limits
    max_send_message_bytes: int = 16 * MIB
    # Calls one client connection may have open at once (kubelet makes a
    # handful per pod worker); bounds what a client that never reads can hold.
    max_concurrent_streams: int = 1000
    grace_period: float = 10.0  # seconds in-flight unary calls get on SIGTERM
    probe_max_interval: float = 5.0  # backoff ceiling while the backend is absent
    # Seconds between checks that the hook state has no record of an object the
    # runtime no longer lists (one removed past the proxy); 0: never.
    state_resync_interval: float = 300.0
    metrics_listen: str | None = None  # host:port for Prometheus, None: off
    # frames: each client connection relayed frame by frame to its own runtime
    # connection, hooked calls run in place; grpc: every call re-issued through grpc.aio
    data_path: str = field(default="frames", metadata={"choices": ("frames", "grpc")})
    # auto: uvloop when installed, else asyncio's (eventloop.resolve)
    event_loop: str = field(default="auto", metadata={"choices": EVENT_LOOPS})
    log_format: str = field(default="text", metadata={"choices": ("text", "json")})
    log_level: str = field(default="info", metadata={"choices": ("debug", "info", "warning", "error")})
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def with_overrides(self, **values: Any) -> ProxyConfig:
        """Apply values that were actually given (None means 'not given')."""
        given = {k: v for k, v in values.items() if v is not None}
        return dataclasses.replace(self, **_coerce(given))


_PATHS = {"listen", "backend", "image_backend", "hook_dir"}
_SOCKETS = {"listen", "backend", "image_backend"}  # may be written as endpoint URLs
_KEYS = {f.name for f in dataclasses.fields(ProxyConfig)} - {"extra"}
# setting -> the values it accepts, declared once on the field (the CLI offers the same)
_CHOICES: dict[str, tuple[str, ...]] = {
    f.name: f.metadata["choices"] for f in dataclasses.fields(ProxyConfig) if "choices" in f.metadata
}
_POSITIVE_INTS = {"max_recv_message_bytes", "max_send_message_bytes"}
_POSITIVE_COUNTS = {"max_concurrent_streams"}
INT32_MAX = 2**31 - 1  # grpc's (C-core's) limit for these three
# Seconds: 0 means something for these (no grace, never resync)...
_NON_NEGATIVE_NUMBERS = {"grace_period", "state_resync_interval"}
# ...and for this one a busy loop (probes without a pause).
_POSITIVE_NUMBERS = {"probe_max_interval"}
MIN_RESYNC_INTERVAL = 1.0  # each resync lists every pod and container


def choices(setting: str) -> tuple[str, ...]:
    """The values a setting accepts; empty when it is not a choice."""
    return _CHOICES.get(setting, ())


def parse_host_port(address: str, setting: str = "metrics-listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT``; no host, or a bare port: 127.0.0.1) as
    (host, port), or a ConfigError naming ``setting``; what serve binds is what
    this accepted."""
    key = setting.replace("-", "_")
    host, _colon, port = address.rpartition(":")
    if not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ConfigError(
            f"{setting} {shown(address)}: expected HOST:PORT with a port from 0 to 65535 (':PORT' for 127.0.0.1)", key=key
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:  # an IPv6 address unbracketed: where it ends is a guess
        raise ConfigError(f"{setting} {shown(address)}: an IPv6 address goes in brackets, [ADDR]:PORT", key=key)
    if host and not _may_be_host(host):
        raise ConfigError(
            f"{setting} {shown(address)}: {host!r} is not an IP address or a host name (0.0.0.0 or [::] for every address)",
            key=key,
        )
    return host or "127.0.0.1", int(port)


_HOST_LABEL = re.compile(r"[A-Za-z0-9_-]{1,63}")  # RFC 1123's, and _ as /etc/hosts may have it


def _may_be_host(host: str) -> bool:
    """Whether ``host`` could be bound, as far as its spelling tells: only
    resolving tells the rest, which serve does as it binds (metrics.py)."""
    if re.fullmatch(r"[0-9.]+", host):  # no resolver knows such a name: an IPv4 address or nothing
        try:
            socket.inet_aton(host)  # the forms getaddrinfo reads (127.1 too)
        except OSError:
            return False
        return True
    try:
        ipaddress.IPv6Address(host)  # [fe80::1%eth0] too
    except ValueError:
        pass
    else:  # an interface's name has no control character (ipaddress takes any scope: a NUL fails the lookup)
        return not any(ord(char) < 0x20 or ord(char) == 0x7F for char in host.partition("%")[2])
    labels = host.removesuffix(".").split(".")
    return len(host) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


def _seconds(value: Any, positive: bool) -> bool:
    """A finite number of seconds (inf or nan would pass a plain comparison)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value > 0 if positive else value >= 0


def _path(name: str, key: str, value: Any) -> Path:
    # An empty path would be ".", a NUL fails only when serve opens it.
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str) or not text or "\0" in text:
        raise ConfigError(f"{name} {shown(value)}: expected a path", key=key)
    try:
        path = absolute_path(endpoint_path(text) if key in _SOCKETS else text)
    except EndpointURLError as exc:
        raise ConfigError(f"{name} {shown(value)}: {exc}", key=key) from None
    except RuntimeError:  # ~user of no such user, or no HOME
        raise ConfigError(f"{name} {shown(value)}: cannot expand ~ (no such user, or no home directory)", key=key) from None
    problem = unixsocket.dial_problem(path) if key in _SOCKETS else None
    if problem is not None:  # the proxy dials the backends; listen is dialled by `runtime-proxy status`, the bench
        raise ConfigError(f"{name} {shown(text)}: {problem}", key=key)
    return path


def absolute_path(text: str | os.PathLike[str]) -> Path:
    """``~`` expanded, then absolute from the current directory: grpc reads a
    relative ``unix:NAME`` as ``/NAME``, and the proxy's own code from where
    it happens to run. Symlinks and ``..`` are kept, for the kernel to follow."""
    return Path(text).expanduser().absolute()


def _coerce(values: dict[str, Any], spelt: dict[str, str] | None = None) -> dict[str, Any]:
    """Check and convert settings, so that a bad value stops start-up with a
    clear message instead of failing every call later (the first bad one
    raises). ``spelt``: each key as the file wrote it (- or _), for the messages."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in _KEYS:
            raise ConfigError(f"unknown setting {(spelt or {}).get(key, key)!r}{_did_you_mean(key)}", key=key)
        if value is not None:  # `key:` with nothing after it, or `null`: the default, as if left out
            out[key] = _coerce_one(key, value)
    return out


def _coerce_one(key: str, value: Any) -> Any:
    """One known setting's value, checked and converted; a ConfigError naming it."""
    name = key.replace("_", "-")
    if key in _PATHS:
        value = _path(name, key, value)
    elif key in _CHOICES and value not in _CHOICES[key]:
        raise ConfigError(f"{name} {shown(value)}: expected one of {', '.join(_CHOICES[key])}", key=key)
    elif key in _POSITIVE_INTS and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= INT32_MAX):
        raise ConfigError(f"{name} {shown(value)}: expected a positive number of bytes, at most {INT32_MAX}", key=key)
    elif key in _POSITIVE_COUNTS and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= INT32_MAX):
        raise ConfigError(f"{name} {shown(value)}: expected a positive number, at most {INT32_MAX}", key=key)
    elif key in _NON_NEGATIVE_NUMBERS and not _seconds(value, positive=False):
        raise ConfigError(f"{name} {shown(value)}: expected a number of seconds (finite, 0 or more)", key=key)
    elif key in _POSITIVE_NUMBERS and not _seconds(value, positive=True):
        raise ConfigError(f"{name} {shown(value)}: expected a number of seconds (finite, more than 0)", key=key)
    elif key == "state_resync_interval" and 0 < value < MIN_RESYNC_INTERVAL:
        raise ConfigError(f"{name} {shown(value)}: 0 (never) or at least {MIN_RESYNC_INTERVAL:g} seconds", key=key)
    elif key == "metrics_listen":
        if not isinstance(value, str):
            raise ConfigError(f"{name} {shown(value)}: expected HOST:PORT as a string (':PORT' for 127.0.0.1)", key=key)
        if not value:  # off, as for `runtime-proxy nri`
            value = None
        else:
            parse_host_port(value, name)
    elif key == "serve_versions":
        if not isinstance(value, (str, int, float)):  # never str(): a list may be a billion laughs
            raise ConfigError(f"{name} {shown(value)}: expected auto or a list of {', '.join(CRI_VERSIONS)}", key=key)
        try:
            parse_serve_versions(str(value))
        except VersionPlanError as exc:
            raise ConfigError(str(exc), key=key) from exc
    return value


# Flags of serve that are no YAML key: what the file says instead.
_FLAG_ONLY = {
    "max_message_size": "max-recv-message-bytes and max-send-message-bytes, one each",
    "local_containerd": "none: it is the flag --local-containerd only",
    "config": "none: it is the flag --config only",
}


def _did_you_mean(key: str) -> str:
    """The closest setting to an unknown key (a typo), spelt as the docs' table does."""
    if key in _FLAG_ONLY:
        return f" (in YAML: {_FLAG_ONLY[key]})"
    close = difflib.get_close_matches(key, sorted(_KEYS), n=1)
    return f" (did you mean {close[0].replace('_', '-')!r}?)" if close else ""


@dataclass(frozen=True)
class ConfigWarning:
    """What serve accepts in a config file but likely is a slip (a key given
    twice, with the same value): logged at start, a check-config warning."""

    message: str
    line: int | None = None


def load(path: Path | None) -> ProxyConfig:
    """The settings in a YAML file (keys as the flags, with - or _)."""
    return load_checked(path)[0]


def load_checked(path: Path | None) -> tuple[ProxyConfig, tuple[ConfigWarning, ...]]:
    """:func:`load`, with what the file says that is accepted but likely a
    slip; a ConfigError naming every error of the file (:func:`check_file`'s,
    as `check-config` shows them), so that one pass fixes them all."""
    if path is None:
        return ProxyConfig(), ()
    checked = check_file(path)
    if checked.errors:
        raise refusal(path, checked.errors)
    return checked.settings, checked.warnings


def refusal(path: Path | None, errors: Sequence[ConfigError], flag_errors: Sequence[ConfigError] = ()) -> ConfigError:
    """What ``serve`` stops with: the one error as it is, or each on a line of
    its own under a heading naming where they are, the config file's
    (``errors``), the flags' (``flag_errors``: a value, a clash a flag makes)
    or both; with both, a flag's is marked so."""
    every = [*errors, *flag_errors]
    if len(every) == 1:
        return every[0]
    prefix = f"config file {path}: "
    mark = "flags: " if errors else ""
    listed = [f"  {str(exc).removeprefix(prefix)}" for exc in errors] + [f"  {mark}{exc}" for exc in flag_errors]
    if not flag_errors:
        heading = f"config file {path}: {len(every)} errors"
    elif not errors:
        heading = f"{len(every)} errors in the flags"
    else:
        heading = f"{len(every)} errors in config file {path} and the flags"
    line = errors[0].line if errors else None
    return ConfigError("\n".join([f"{heading}:", *listed]), line=line)


def _in_file(path: Path, exc: ConfigError, read: _File) -> ConfigError:
    """A setting's error as a config file's: its name, and the setting's line."""
    line = read.lines.get(exc.key or "")
    where = f" (line {line})" if line is not None else ""
    return ConfigError(f"config file {path}: {exc}{where}", key=exc.key, line=line)


@dataclass(frozen=True)
class FileCheck:
    """Every error of a config file, for `check-config` and `serve` alike."""

    settings: ProxyConfig  # the file's settings, each refused one (``refused``) at its default
    errors: tuple[ConfigError, ...]  # by line
    refused: frozenset[str]  # settings whose value is refused; all when the file cannot be read
    warnings: tuple[ConfigWarning, ...]


def check_file(path: Path) -> FileCheck:
    """What :func:`load_checked` says of ``path``, every error included."""
    try:
        read = _read(path)
    except ConfigError as exc:  # not read at all: no setting is known
        return FileCheck(ProxyConfig(), (exc,), frozenset(_KEYS), ())
    errors = list(read.conflicts)
    refused = {exc.key for exc in read.conflicts if exc.key}  # given twice: neither value is checked further
    values: dict[str, Any] = {}
    for key, value in read.values.items():
        if key in refused:  # given twice: which value stays is the operator's choice, checked then
            continue
        try:
            values.update(_coerce({key: value}, read.written))
        except ConfigError as exc:
            errors.append(_in_file(path, exc, read))
            refused.add(exc.key or key)
    settings = dataclasses.replace(ProxyConfig(), **{k: v for k, v in values.items() if k not in refused})
    errors.sort(key=lambda exc: exc.line or 0)
    return FileCheck(settings, tuple(errors), frozenset(refused), read.warnings)


def given_in(path: Path | None) -> dict[str, Any]:
    """The settings the YAML file gives a value (a null is the default, as if
    left out), each as written (a relative path not made absolute): what a
    flag that replaces them must not silently drop."""
    return {key: value for key, value in _read(path).values.items() if value is not None} if path else {}


def key_line(path: Path, key: str) -> int | None:
    """The line (1-based) where the config file at ``path`` sets ``key``."""
    return _read(path).lines.get(key)


def file_error(path: Path, key: str, message: str) -> ConfigError:
    """``key``'s setting in the config file at ``path`` refused, naming its line as load's errors do."""
    line = key_line(path, key)
    where = f" (line {line})" if line is not None else ""
    return ConfigError(f"config file {path}: {message}{where}", key=key, line=line)


@dataclass(frozen=True)
class _File:
    """A config file as written, unchecked; keys by setting name (- read as _)."""

    values: dict[str, Any]
    written: dict[str, str]  # each key as the file spells it, for the messages
    lines: dict[str, int]
    warnings: tuple[ConfigWarning, ...]
    conflicts: tuple[ConfigError, ...]  # keys given twice with different values


def _read(path: Path) -> _File:
    """The file's keys and values, read from the same YAML nodes: a key that
    YAML 1.1 reads as no string (``on:``, ``1:``) is named as written."""
    try:
        doc = yamlkeys.Document(path.read_text())
        top = doc.value()
        pairs = doc.top_pairs()
        repeats = doc.repeats(same_key=lambda written: written.replace("-", "_"))
    except RecursionError:
        raise ConfigError(f"cannot read config file {path}: YAML nested too deeply") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(f"cannot read config file {path}: {exc}", line=line) from exc
    if top is not None and not isinstance(top, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top level", line=1)
    warnings: list[ConfigWarning] = []
    conflicts: list[ConfigError] = []
    for repeat in repeats:  # yamlkeys.check_repeats' rule, every repeat kept
        if repeat.same:
            warnings.append(ConfigWarning(f"config file {path}: {repeat}", repeat.line))
        else:
            conflicts.append(ConfigError(f"config file {path}: {repeat}", key=repeat.first.replace("-", "_"), line=repeat.line))
    values: dict[str, Any] = {}
    written: dict[str, str] = {}
    lines: dict[str, int] = {}
    for name, line, value in pairs:  # merged keys first: the mapping's own win, as in YAML
        key = name.replace("-", "_")
        values[key], written[key], lines[key] = value, name, line
    versions = values.get("serve_versions")
    if isinstance(versions, list) and len(versions) <= 8 and all(isinstance(v, (str, int, float)) for v in versions):
        # str(): a list of numbers is a bad value for the check below, not a crash here. A list
        # of lists, or of many aliases of one long string, is never joined (a billion laughs,
        # or one squared): left for the check to refuse, shown cut short.
        values["serve_versions"] = ",".join(map(str, versions))
    return _File(values, written, lines, tuple(warnings), tuple(conflicts))
