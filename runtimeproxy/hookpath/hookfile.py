"""Hook server registration: the ``*.json`` files of the hook directory.

A hook server registers itself by dropping a JSON file into the hook directory
(default ``/etc/runtime/hookserver.d``).  The format is Koordinator's
(``koord-runtime-proxy``)::

    {
      "remote-endpoint": "/var/run/koordlet/koordlet.sock",
      "failure-policy": "Ignore",
      "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer"]
    }

plus two optional keys of ours:

``timeout``
    a Go-style duration string ("1s", "500ms", "1.5s", "2m", "1m30s");
    default ``"2s"``; must be > 0.
``priority``
    an integer; hook servers registered for the same hook point are called in
    ascending ``(priority, file name)`` order; default ``0``.

Leniency follows Koordinator exactly where Koordinator is lenient:

* ``failure-policy`` may be missing, ``null`` or ``""`` (Koordinator's
  ``PolicyNone``), which behaves like ``Ignore``;
* ``runtime-hooks`` may be missing or empty (the server is registered for
  nothing; a warning is logged);
* unknown extra keys are ignored (debug log).

Everything else is strict: invalid JSON, a non-object document, an unknown hook
name (only the seven hook points of ``RuntimeHookService`` are accepted), an
unknown policy, a missing/empty/relative endpoint, a bad timeout or a
non-integer priority reject the file with a reason naming it.

Permission safety: whoever can write into the hook directory can change every
container on the node, so a hook directory, or a hook file (for a symlink: its
resolved target and the target's directory), that is writable by group or
others or is not owned by root / the current euid is refused.  An unsafe
directory means no hooks at all; an unsafe file is rejected like an invalid
one.

Only regular ``*.json`` files directly in the directory (symlinks to regular
files included) are considered; hidden files (``.name.json``, e.g. editors'
lock files) and sub-directories are skipped.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import math
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType

from ..host.unixsocket import MAX_PATH as MAX_SOCKET_PATH
from .points import HookType

__all__ = [
    "DEFAULT_HOOK_DIR",
    "DEFAULT_PRIORITY",
    "DEFAULT_TIMEOUT",
    "KEY_ENDPOINT",
    "KEY_FAILURE_POLICY",
    "KEY_PRIORITY",
    "KEY_RUNTIME_HOOKS",
    "KEY_TIMEOUT",
    "FailurePolicy",
    "HookConfigError",
    "HookRegistry",
    "HookServerConfig",
    "HookSnapshot",
    "HookType",
    "ReloadResult",
    "check_path_safety",
    "format_duration",
    "parse_duration",
    "parse_hook_document",
    "parse_hook_file",
]

logger = logging.getLogger(__name__)

DEFAULT_HOOK_DIR = Path("/etc/runtime/hookserver.d")
DEFAULT_TIMEOUT = 2.0  # seconds ("2s")
DEFAULT_PRIORITY = 0
# A pre hook holds up kubelet's call, and kubelet gives up on a runtime call
# after 2 minutes by default: a longer hook timeout only hides a hung server.
MAX_TIMEOUT = 120.0
MAX_HOOK_FILE_SIZE = 1 << 20  # a hook file is a few hundred bytes; refuse absurd ones

KEY_ENDPOINT = "remote-endpoint"
KEY_FAILURE_POLICY = "failure-policy"
KEY_RUNTIME_HOOKS = "runtime-hooks"
KEY_TIMEOUT = "timeout"
KEY_PRIORITY = "priority"
KNOWN_KEYS = frozenset({KEY_ENDPOINT, KEY_FAILURE_POLICY, KEY_RUNTIME_HOOKS, KEY_TIMEOUT, KEY_PRIORITY})


class FailurePolicy(enum.Enum):
    """What the proxy does when a hook server fails (error, timeout, unavailable)."""

    FAIL = "Fail"  # fail the CRI call
    IGNORE = "Ignore"  # log and forward the CRI call unmodified by this hook

    def __str__(self) -> str:
        return self.value


class HookConfigError(Exception):
    """A hook file was rejected; ``reason`` says why, ``path`` names the file."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"hook config {self.path}: {reason}")


@dataclass(frozen=True)
class HookServerConfig:
    """One hook server registration (one valid hook file)."""

    name: str  # file name, e.g. "koordlet.json"; unique within the directory
    endpoint: str  # absolute path of the hook server's unix socket
    failure_policy: FailurePolicy
    hooks: frozenset[HookType]
    timeout: float = DEFAULT_TIMEOUT  # seconds
    priority: int = DEFAULT_PRIORITY

    @property
    def sort_key(self) -> tuple[int, str]:
        return (self.priority, self.name)

    def describe(self) -> str:
        hooks = ",".join(sorted(h.value for h in self.hooks)) or "-"
        return (
            f"endpoint={self.endpoint} hooks=[{hooks}] failure_policy={self.failure_policy.value} "
            f"timeout={format_duration(self.timeout)} priority={self.priority}"
        )

    def log_fields(self) -> dict[str, object]:
        return {
            "hook_file": self.name,
            "hook_endpoint": self.endpoint,
            "hook_points": sorted(h.value for h in self.hooks),
            "hook_failure_policy": self.failure_policy.value,
            "hook_timeout": self.timeout,
            "hook_priority": self.priority,
        }


# --------------------------------------------------------------------------- durations

_DURATION_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign, as Go accepts
    "μs": 1_000,  # U+03BC greek mu, as Go accepts
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)"
_DURATION_RE = re.compile(rf"(?:{_DURATION_PART})+")
_DURATION_PART_RE = re.compile(_DURATION_PART)


def parse_duration(text: str) -> float:
    """Parse a Go-style duration string ("500ms", "1.5s", "2m", "1m30s") into seconds.

    Every number needs a unit (ns, us/µs, ms, s, m, h); signs are not accepted.
    Raises ``ValueError`` on malformed input.  Zero is returned as 0.0 (callers
    decide whether it is acceptable).
    """
    if not isinstance(text, str):
        raise ValueError(f"duration must be a string like \"2s\", got {type(text).__name__}")
    if not _DURATION_RE.fullmatch(text):
        raise ValueError(
            f"invalid duration {text!r} (expected a number with a unit, e.g. \"500ms\", \"1.5s\", \"2m\")"
        )
    total_ns = sum(
        (Decimal(number) * _DURATION_UNITS_NS[unit] for number, unit in _DURATION_PART_RE.findall(text)),
        Decimal(0),
    )
    seconds = float(total_ns / 1_000_000_000)
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {text!r}: out of range")
    return seconds


def format_duration(seconds: float) -> str:
    """Inverse of :func:`parse_duration` for display/writing: 2.0 -> "2s", 0.5 -> "500ms"."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValueError(f"duration must be a number of seconds, got {seconds!r}")
    if seconds <= 0 or not math.isfinite(seconds):
        raise ValueError(f"duration must be a positive finite number of seconds, got {seconds!r}")
    value = Decimal(repr(float(seconds)))
    for unit, factor in (("s", 1), ("ms", Decimal("1e-3")), ("us", Decimal("1e-6")), ("ns", Decimal("1e-9"))):
        scaled = value / factor
        if scaled >= 1 or unit == "ns":
            text = format(scaled.normalize(), "f")
            return f"{text}{unit}"
    raise AssertionError("unreachable")  # pragma: no cover


# --------------------------------------------------------------------------- permissions


def _unsafe_reason(st: os.stat_result, what: str) -> str | None:
    """Why a stat result is not trusted, or None if it is."""
    euid = os.geteuid()
    if st.st_uid not in (0, euid):
        return f"{what} is owned by uid {st.st_uid}, not root or the current euid {euid}"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if mode & bit)
        return f"{what} is writable by {who} (mode {mode:04o}); it must not be group/other-writable"
    return None


def check_path_safety(path: Path, what: str = "path") -> str | None:
    """Return why ``path`` (followed if a symlink) is not trusted, or None if it is safe.

    Missing paths and stat errors are reported as reasons too.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot stat {what} {path}: {exc.strerror or exc}"
    return _unsafe_reason(st, f"{what} {path}")


def _read_hook_file(path: Path, check_permissions: bool) -> bytes:
    """Open ``path`` (following symlinks), check the opened inode and return its content.

    The permission check is done on the opened file descriptor so that what is
    checked is what is read.
    """
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as exc:
        try:
            target = os.readlink(path)
        except OSError:  # not a symlink, or removed meanwhile
            raise HookConfigError(path, "file does not exist") from exc
        raise HookConfigError(path, f"dangling symlink (target {target!r} does not exist)") from exc
    except OSError as exc:
        raise HookConfigError(path, f"cannot open: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HookConfigError(path, "not a regular file")
        if check_permissions:
            target = Path(os.path.realpath(path))
            real_dir = Path(os.path.realpath(path.parent))
            what = "file" if target == real_dir / path.name else f"symlink target {target}"
            reason = _unsafe_reason(st, what)
            if reason is None and target.parent != real_dir:
                # A symlink into another directory: whoever can write that
                # directory can replace the target.
                reason = check_path_safety(target.parent, "symlink target directory")
            if reason is not None:
                raise HookConfigError(path, f"refused: {reason}")
        if st.st_size > MAX_HOOK_FILE_SIZE:
            raise HookConfigError(path, f"file too large ({st.st_size} bytes > {MAX_HOOK_FILE_SIZE})")
        chunks: list[bytes] = []
        remaining = MAX_HOOK_FILE_SIZE + 1
        while remaining > 0:
            chunk = os.read(fd, min(65536, remaining))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > MAX_HOOK_FILE_SIZE:
            raise HookConfigError(path, f"file too large (> {MAX_HOOK_FILE_SIZE} bytes)")
        return data
    except OSError as exc:
        raise HookConfigError(path, f"cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- parsing


def parse_hook_document(path: Path, doc: object) -> HookServerConfig:
    """Validate an already-decoded hook file document; ``path`` names it in errors.

    Raises :class:`HookConfigError`.  This is :func:`parse_hook_file` without
    the reading and permission checks (used e.g. to validate before writing).
    """
    path = Path(path)
    if not isinstance(doc, dict):
        raise HookConfigError(path, f"top-level JSON value must be an object, got {_json_type(doc)}")

    endpoint = doc.get(KEY_ENDPOINT)
    if endpoint is None:
        raise HookConfigError(path, f'missing "{KEY_ENDPOINT}" (the hook server\'s unix socket path)')
    if not isinstance(endpoint, str):
        raise HookConfigError(path, f'"{KEY_ENDPOINT}" must be a string, got {_json_type(endpoint)}')
    if not endpoint.strip():
        raise HookConfigError(path, f'"{KEY_ENDPOINT}" is empty')
    if not os.path.isabs(endpoint):
        raise HookConfigError(path, f'"{KEY_ENDPOINT}" must be an absolute socket path, got {endpoint!r}')
    if "\x00" in endpoint:
        raise HookConfigError(path, f'"{KEY_ENDPOINT}" contains a NUL byte')
    try:
        encoded = endpoint.encode()
    except UnicodeEncodeError:
        raise HookConfigError(path, f'"{KEY_ENDPOINT}" is not a valid UTF-8 path: {endpoint!r}') from None
    if len(encoded) > MAX_SOCKET_PATH:
        raise HookConfigError(
            path, f'"{KEY_ENDPOINT}" is {len(encoded)} bytes long; a unix socket path has at most {MAX_SOCKET_PATH}'
        )

    raw_policy = doc.get(KEY_FAILURE_POLICY)
    if raw_policy is None or raw_policy == "":
        # Koordinator's PolicyNone: errors are ignored, like "Ignore".
        policy = FailurePolicy.IGNORE
    elif not isinstance(raw_policy, str):
        raise HookConfigError(path, f'"{KEY_FAILURE_POLICY}" must be a string, got {_json_type(raw_policy)}')
    else:
        try:
            policy = FailurePolicy(raw_policy)
        except ValueError:
            allowed = ", ".join(repr(p.value) for p in FailurePolicy)
            raise HookConfigError(
                path, f'unknown "{KEY_FAILURE_POLICY}" {raw_policy!r} (allowed: {allowed})'
            ) from None

    raw_hooks = doc.get(KEY_RUNTIME_HOOKS)
    if raw_hooks is None:
        raw_hooks = []
    if not isinstance(raw_hooks, list):
        raise HookConfigError(path, f'"{KEY_RUNTIME_HOOKS}" must be a list of hook names, got {_json_type(raw_hooks)}')
    hooks: set[HookType] = set()
    for item in raw_hooks:
        if not isinstance(item, str):
            raise HookConfigError(path, f'"{KEY_RUNTIME_HOOKS}" entries must be strings, got {_json_type(item)}')
        try:
            hooks.add(HookType(item))
        except ValueError:
            allowed = ", ".join(h.value for h in HookType)
            raise HookConfigError(path, f"unknown runtime hook {item!r} (allowed: {allowed})") from None

    timeout = DEFAULT_TIMEOUT
    if KEY_TIMEOUT in doc:
        raw_timeout = doc[KEY_TIMEOUT]
        if not isinstance(raw_timeout, str):
            raise HookConfigError(
                path, f'"{KEY_TIMEOUT}" must be a duration string like "2s" or "500ms", got {_json_type(raw_timeout)}'
            )
        try:
            timeout = parse_duration(raw_timeout)
        except ValueError as exc:
            raise HookConfigError(path, f'bad "{KEY_TIMEOUT}": {exc}') from None
        if timeout <= 0:
            raise HookConfigError(path, f'bad "{KEY_TIMEOUT}": {raw_timeout!r} must be greater than zero')
        if timeout > MAX_TIMEOUT:
            raise HookConfigError(path, f'bad "{KEY_TIMEOUT}": {raw_timeout!r} is more than the limit of {MAX_TIMEOUT:g}s')

    priority = DEFAULT_PRIORITY
    if KEY_PRIORITY in doc:
        raw_priority = doc[KEY_PRIORITY]
        # bool is an int subclass in Python; JSON true/false is not a priority.
        if not isinstance(raw_priority, int) or isinstance(raw_priority, bool):
            raise HookConfigError(path, f'"{KEY_PRIORITY}" must be an integer, got {_json_type(raw_priority)} {raw_priority!r}')
        priority = raw_priority

    unknown = sorted(set(doc) - KNOWN_KEYS)
    if unknown:
        logger.debug(
            "hook config %s: ignoring unknown keys %s",
            path.name,
            unknown,
            extra={"hook_file": path.name, "hook_unknown_keys": unknown},
        )

    return HookServerConfig(
        name=path.name,
        endpoint=endpoint,
        failure_policy=policy,
        hooks=frozenset(hooks),
        timeout=timeout,
        priority=priority,
    )


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__  # pragma: no cover


def parse_hook_file(path: Path, *, check_permissions: bool = True) -> HookServerConfig:
    """Read, check and validate one hook file.

    Raises :class:`HookConfigError` (with the file and the reason) when the file
    cannot be read, is unsafe (``check_permissions``), or is invalid.  The
    directory's own safety is checked by :class:`HookRegistry`, not here.
    """
    path = Path(path)
    data = _read_hook_file(path, check_permissions)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise HookConfigError(path, f"not valid UTF-8: {exc}") from None
    if not text.strip():
        raise HookConfigError(path, "file is empty")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HookConfigError(path, f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise HookConfigError(path, "invalid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise HookConfigError(path, f"invalid JSON: {exc}") from None
    return parse_hook_document(path, doc)


# --------------------------------------------------------------------------- registry


def _by_hook(servers: Iterable[HookServerConfig]) -> Mapping[HookType, tuple[HookServerConfig, ...]]:
    ordered = sorted(servers, key=lambda s: s.sort_key)
    return MappingProxyType({hook: tuple(s for s in ordered if hook in s.hooks) for hook in HookType})


@dataclass(frozen=True, eq=False)
class HookSnapshot:
    """An immutable view of the registered hook servers at one point in time."""

    servers: Mapping[str, HookServerConfig] = field(default_factory=lambda: MappingProxyType({}))
    generation: int = 0  # incremented each time the set of configs changes

    def __post_init__(self) -> None:
        object.__setattr__(self, "servers", MappingProxyType(dict(sorted(self.servers.items()))))
        object.__setattr__(self, "_by_hook", _by_hook(self.servers.values()))

    def servers_for(self, hook: HookType) -> tuple[HookServerConfig, ...]:
        """Hook servers registered for ``hook``, ordered by (priority, file name)."""
        return self._by_hook[hook]  # type: ignore[attr-defined]

    @property
    def endpoints(self) -> frozenset[str]:
        """All endpoints in use (a channel to an endpoint not in here can be closed)."""
        return frozenset(s.endpoint for s in self.servers.values())

    def __len__(self) -> int:
        return len(self.servers)


@dataclass(frozen=True)
class ReloadResult:
    """What one :meth:`HookRegistry.reload` did.

    ``rejected`` maps every file currently rejected (invalid or unsafe) to the
    reason; those also in ``kept`` still have their last good version in effect.
    ``directory_error`` is set when the directory itself is unusable (missing,
    not a directory, unsafe): then no hooks are loaded at all.
    """

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    rejected: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    kept: tuple[str, ...] = ()
    directory_error: str | None = None
    snapshot: HookSnapshot = field(default_factory=HookSnapshot)

    @property
    def modified(self) -> bool:
        """True when the effective set of hook configs changed."""
        return bool(self.added or self.changed or self.removed)


ChangeCallback = Callable[[HookSnapshot], object]


class HookRegistry:
    """The current set of hook server configs of one hook directory.

    Readers (``servers_for``/``snapshot``) never lock: the snapshot is an
    immutable object replaced atomically by :meth:`reload`.  :meth:`reload` is
    serialized by a lock and may be called from any thread; change callbacks
    run synchronously in the reloading thread (the event loop thread when
    called by :meth:`watch`) and must be quick and non-blocking.
    """

    def __init__(
        self,
        directory: Path | str = DEFAULT_HOOK_DIR,
        *,
        check_permissions: bool = True,
        debounce_ms: int = 100,
        step_ms: int = 50,
        resync_interval: float = 2.0,
        dir_poll_interval: float = 0.25,
        error_backoff: float = 1.0,
    ) -> None:
        self._directory = Path(directory)
        self._check_permissions = check_permissions
        self._debounce_ms = debounce_ms
        self._step_ms = step_ms
        self._resync_interval = resync_interval
        self._dir_poll_interval = dir_poll_interval
        self._error_backoff = error_backoff
        self._snapshot = HookSnapshot()
        self._lock = threading.Lock()
        self._callbacks: list[ChangeCallback] = []
        # Log de-duplication: report a rejection / directory problem once until it changes.
        self._rejection_fingerprints: dict[str, tuple[object, ...]] = {}
        self._last_directory_error: str | None = None

    # -- read side (hot path, lock-free) --------------------------------------

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def snapshot(self) -> HookSnapshot:
        return self._snapshot

    def servers_for(self, hook: HookType) -> tuple[HookServerConfig, ...]:
        """Hook servers registered for ``hook``, ordered by (priority, file name)."""
        return self._snapshot.servers_for(hook)

    # -- subscriptions ---------------------------------------------------------

    def on_change(self, callback: ChangeCallback) -> Callable[[], None]:
        """Call ``callback(snapshot)`` after every reload that changed the configs.

        Returns a function that unsubscribes the callback.
        """
        with self._lock:
            self._callbacks.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                try:
                    self._callbacks.remove(callback)
                except ValueError:
                    pass

        return unsubscribe

    # -- reload ------------------------------------------------------------------

    def reload(self) -> ReloadResult:
        """Rescan the directory and atomically replace the snapshot; see :class:`ReloadResult`."""
        with self._lock:
            result = self._reload_locked()
            callbacks = list(self._callbacks)
        if result.modified:
            for callback in callbacks:
                try:
                    callback(result.snapshot)
                except Exception:
                    logger.exception(
                        "hook config change callback %r failed", callback, extra={"hook_dir": str(self._directory)}
                    )
        return result

    def _directory_problem(self) -> tuple[str | None, int]:
        """(why the directory is unusable or None, log level for it)."""
        directory = self._directory
        try:
            st = os.stat(directory)
        except FileNotFoundError:
            # Normal before the first hook server registers: not an error.
            return f"hook directory {directory} does not exist", logging.WARNING
        except OSError as exc:
            return f"cannot stat hook directory {directory}: {exc.strerror or exc}", logging.ERROR
        if not stat.S_ISDIR(st.st_mode):
            return f"hook directory {directory} is not a directory", logging.ERROR
        if self._check_permissions:
            reason = _unsafe_reason(st, f"hook directory {directory}")
            if reason is not None:
                return f"refusing to load any hook: {reason}", logging.ERROR
        return None, logging.INFO

    def _list_candidates(self) -> list[Path]:
        candidates = []
        with os.scandir(self._directory) as it:
            for entry in it:
                if not entry.name.endswith(".json"):
                    continue
                if entry.name.startswith("."):
                    logger.debug("skipping hidden hook file %s", entry.name, extra={"hook_file": entry.name})
                    continue
                try:
                    if entry.is_dir():  # follows symlinks
                        continue
                except OSError:
                    pass
                candidates.append(Path(entry.path))
        return sorted(candidates, key=lambda p: p.name)

    def _reload_locked(self) -> ReloadResult:
        old = self._snapshot
        problem, problem_level = self._directory_problem()
        new_servers: dict[str, HookServerConfig] = {}
        rejected: dict[str, str] = {}
        kept: list[str] = []

        if problem is None:
            try:
                candidates = self._list_candidates()
            except OSError as exc:
                problem = f"cannot list hook directory {self._directory}: {exc.strerror or exc}"
                problem_level = logging.ERROR
                candidates = []
        else:
            candidates = []

        if problem is not None:
            if problem != self._last_directory_error:
                logger.log(
                    problem_level,
                    "%s; no hooks are active",
                    problem,
                    extra={"hook_dir": str(self._directory), "reason": problem},
                )
            self._last_directory_error = problem
            self._rejection_fingerprints.clear()
        else:
            if self._last_directory_error is not None:
                logger.info(
                    "hook directory %s is usable again",
                    self._directory,
                    extra={"hook_dir": str(self._directory)},
                )
            self._last_directory_error = None

        for path in candidates:
            name = path.name
            try:
                config = parse_hook_file(path, check_permissions=self._check_permissions)
            except Exception as exc:  # one odd file must never stop the others from loading
                if not os.path.lexists(path):
                    continue  # deleted since the directory was listed: it is simply gone
                if isinstance(exc, HookConfigError):
                    reason = exc.reason
                else:
                    reason = f"cannot be read: {type(exc).__name__}: {exc}"
                    logger.debug("unexpected error reading hook config", exc_info=True, extra={"hook_file": name})
                rejected[name] = reason
                previous = old.servers.get(name)
                if previous is not None:
                    new_servers[name] = previous
                    kept.append(name)
                self._log_rejection(path, reason, previous)
                continue
            if not config.hooks:
                if name not in old.servers or old.servers[name] != config:
                    logger.warning(
                        "hook config %s registers no runtime hooks; it will never be called",
                        name,
                        extra=config.log_fields(),
                    )
            new_servers[name] = config
            self._rejection_fingerprints.pop(name, None)

        for name in list(self._rejection_fingerprints):
            if name not in rejected:
                del self._rejection_fingerprints[name]

        added = tuple(n for n in sorted(new_servers) if n not in old.servers)
        changed = tuple(n for n in sorted(new_servers) if n in old.servers and old.servers[n] != new_servers[n])
        removed = tuple(n for n in sorted(old.servers) if n not in new_servers)

        for name in added:
            cfg = new_servers[name]
            logger.info("hook config loaded: file=%s %s", name, cfg.describe(), extra={**cfg.log_fields(), "hook_event": "loaded"})
        for name in changed:
            cfg = new_servers[name]
            logger.info(
                "hook config changed: file=%s %s (was %s)",
                name,
                cfg.describe(),
                old.servers[name].describe(),
                extra={**cfg.log_fields(), "hook_event": "changed"},
            )
        for name in removed:
            cfg = old.servers[name]
            logger.info(
                "hook config removed: file=%s %s",
                name,
                cfg.describe(),
                extra={**cfg.log_fields(), "hook_event": "removed"},
            )

        if added or changed or removed:
            snapshot = HookSnapshot(servers=new_servers, generation=old.generation + 1)
            self._snapshot = snapshot  # atomic publication
        else:
            snapshot = old
        return ReloadResult(
            added=added,
            changed=changed,
            removed=removed,
            rejected=MappingProxyType(rejected),
            kept=tuple(kept),
            directory_error=problem,
            snapshot=snapshot,
        )

    def _log_rejection(self, path: Path, reason: str, previous: HookServerConfig | None) -> None:
        try:
            st = os.lstat(path)
            identity: tuple[object, ...] = (st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode, st.st_uid)
        except OSError:
            identity = ()
        fingerprint = (reason, identity, previous)
        name = path.name
        if self._rejection_fingerprints.get(name) == fingerprint:
            logger.debug("hook config %s still rejected: %s", name, reason, extra={"hook_file": name, "reason": reason})
            return
        self._rejection_fingerprints[name] = fingerprint
        extra: dict[str, object] = {"hook_file": name, "hook_event": "rejected", "reason": reason}
        if previous is not None:
            extra["hook_endpoint"] = previous.endpoint
            extra["hook_points"] = sorted(h.value for h in previous.hooks)
            logger.error(
                "hook config rejected: file=%s reason=%s; keeping its last good version (%s)",
                name,
                reason,
                previous.describe(),
                extra={**extra, "hook_kept_last_good": True},
            )
        else:
            logger.error("hook config rejected: file=%s reason=%s", name, reason, extra=extra)

    def _safe_reload(self) -> ReloadResult | None:
        try:
            return self.reload()
        except Exception:
            logger.exception("reloading hook directory %s failed", self._directory, extra={"hook_dir": str(self._directory)})
            return None

    # -- watching ------------------------------------------------------------------

    def _directory_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self._directory)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return None
        return (st.st_dev, st.st_ino)

    async def watch(self, stop: asyncio.Event) -> None:
        """Reload on every change of the directory until ``stop`` is set.

        Uses ``watchfiles.awatch`` (debounce ``debounce_ms``), plus a full
        rescan every ``resync_interval`` seconds (catches changes made while the
        watcher was being set up and edits of symlink targets outside the
        directory).  A missing directory is waited for by polling its existence
        every ``dir_poll_interval`` seconds; a directory that is deleted or
        replaced is re-watched.  Errors are logged, never raised.
        """
        from watchfiles import awatch  # local import: only the watcher needs it

        rust_timeout_ms = max(100, int(self._resync_interval * 1000))
        while not stop.is_set():
            self._safe_reload()
            identity = self._directory_identity()
            if identity is None:
                # Missing (or not a directory): wait for it to appear.
                while not stop.is_set() and self._directory_identity() is None:
                    await _wait_or_timeout(stop, self._dir_poll_interval)
                continue
            # awatch sets its stop event when cancelled; give it its own so that
            # cancelling watch() does not set the caller's event.
            watcher_stop = asyncio.Event()
            bridge = asyncio.create_task(_propagate(stop, watcher_stop))
            changes = awatch(
                self._directory,
                watch_filter=None,  # any change (e.g. a ConfigMap's ..data swap) triggers a rescan
                debounce=self._debounce_ms,
                step=self._step_ms,
                stop_event=watcher_stop,
                rust_timeout=rust_timeout_ms,
                yield_on_timeout=True,
                recursive=False,
            )
            try:
                async for _batch in changes:
                    self._safe_reload()
                    if self._directory_identity() != identity:
                        logger.info(
                            "hook directory %s was removed or replaced; re-watching",
                            self._directory,
                            extra={"hook_dir": str(self._directory)},
                        )
                        break
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception(
                    "watching hook directory %s failed; retrying", self._directory, extra={"hook_dir": str(self._directory)}
                )
                await _wait_or_timeout(stop, self._error_backoff)
            finally:
                watcher_stop.set()
                bridge.cancel()
                await changes.aclose()  # release the inotify watch now, not at GC time


async def _propagate(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()


async def _wait_or_timeout(event: asyncio.Event, timeout: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        pass
