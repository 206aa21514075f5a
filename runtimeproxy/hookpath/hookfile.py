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
``answers``
    ``"changes"`` (an answer's empty cpuset keeps the call's) or ``"whole"``
    (its ``cpuset_cpus``/``cpuset_mems`` are taken whole, as
    koord-runtime-proxy applies them: empty clears); default ``"changes"``,
    but ``"whole"`` for a file named ``koordlet.json`` (koordlet writes that
    file itself at each start, with no room for a key of ours).

Koordinator's keys are read as its Go decoder reads them (:mod:`.hookkeys`):
in any case, the last of a key given twice counting, each with a warning;
ours as written (another spelling of one is an unknown key, with a warning).
Leniency follows Koordinator exactly where Koordinator is lenient:
``failure-policy`` may be missing, ``null`` or ``""`` (Koordinator's
``PolicyNone``, which behaves like ``Ignore``); ``runtime-hooks`` may be
missing, ``null`` or empty (registered for nothing; a warning is logged);
unknown extra keys are ignored (debug log).  Everything else is strict (see
``_KEYS``): invalid JSON, a non-object document, an unknown hook name, an
unknown policy, a missing/empty/relative endpoint, a bad timeout or a
non-integer priority reject the file with a reason naming each refused key.

Permission safety: whoever can write into the hook directory can change every
container on the node, so a hook directory, or a hook file (for a symlink: its
resolved target and the target's directory), that is writable by group or
others or is not owned by root / the current euid is refused.  An unsafe
directory means no hooks at all; an unsafe file is rejected like an invalid
one (:mod:`.filesafety`).

Which files of the directory are read, and when, is :mod:`.registry`'s job.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ..host.unixsocket import MAX_PATH as MAX_SOCKET_PATH
from ..host.unixsocket import dial_problem
from ..shown import shown
from .duration import format_duration, parse_duration
from .filesafety import HookConfigError, check_path_safety, read_hook_file, unsafe_reason
from .hookkeys import KeyNote, match_keys, object_pairs
from .hookkeys import json_type as _json_type
from .points import HookType

__all__ = [
    "DEFAULT_HOOK_DIR", "DEFAULT_PRIORITY", "DEFAULT_TIMEOUT", "WHOLE_BY_DEFAULT",
    "KEY_ANSWERS", "KEY_ENDPOINT", "KEY_FAILURE_POLICY", "KEY_PRIORITY", "KEY_RUNTIME_HOOKS", "KEY_TIMEOUT",
    "Answers", "FailurePolicy", "HookConfigError", "HookServerConfig",
    "check_path_safety", "format_duration", "parse_duration", "parse_hook_document", "parse_hook_file", "unsafe_reason",
]

logger = logging.getLogger(__name__)

DEFAULT_HOOK_DIR = Path("/etc/runtime/hookserver.d")
DEFAULT_TIMEOUT = 2.0  # seconds ("2s")
DEFAULT_PRIORITY = 0
# A pre hook holds up kubelet's call, and kubelet gives up on a runtime call
# after 2 minutes by default: a longer hook timeout only hides a hung server.
MAX_TIMEOUT = 120.0

KEY_ENDPOINT = "remote-endpoint"
KEY_FAILURE_POLICY = "failure-policy"
KEY_RUNTIME_HOOKS = "runtime-hooks"
KEY_TIMEOUT = "timeout"
KEY_PRIORITY = "priority"
KEY_ANSWERS = "answers"


class FailurePolicy(enum.Enum):
    """What the proxy does when a hook server fails (error, timeout, unavailable)."""

    FAIL = "Fail"  # fail the CRI call
    IGNORE = "Ignore"  # log and forward the CRI call unmodified by this hook

    def __str__(self) -> str:
        return self.value


class Answers(enum.Enum):
    """How a hook server's answers read: what an empty cpuset in them means."""

    CHANGES = "changes"  # only what it sets counts: an empty cpuset keeps the call's
    WHOLE = "whole"  # whole resources, as koord-runtime-proxy applies them: an empty cpuset clears

    def __str__(self) -> str:
        return self.value


# Hook files whose server answers whole when the file does not say: koordlet
# writes and rewrites its own at each start (Register()), as
# koord-runtime-proxy, which takes every answer's cpusets whole, reads it.
WHOLE_BY_DEFAULT = frozenset({"koordlet.json"})


def default_answers(file_name: str) -> Answers:
    return Answers.WHOLE if file_name in WHOLE_BY_DEFAULT else Answers.CHANGES


@dataclass(frozen=True)
class HookServerConfig:
    """One hook server registration (one valid hook file)."""

    name: str  # file name, e.g. "koordlet.json"; unique within the directory
    endpoint: str  # absolute path of the hook server's unix socket
    failure_policy: FailurePolicy
    hooks: frozenset[HookType]
    timeout: float = DEFAULT_TIMEOUT  # seconds
    priority: int = DEFAULT_PRIORITY
    answers: Answers = Answers.CHANGES
    # uid owning the hook file (None: not read from a file); its endpoint's
    # socket must be owned by root, the proxy's euid or this uid.
    owner_uid: int | None = None
    # Koordinator hook points it lists that no runtime proxy calls (NEVER_CALLED_HOOKS).
    uncalled_hooks: frozenset[str] = frozenset()
    # Keys read as koord-runtime-proxy reads them though not as we write them
    # (another case, given twice): warnings, not part of the registration.
    key_notes: tuple[KeyNote, ...] = dataclasses.field(default=(), compare=False)

    @property
    def sort_key(self) -> tuple[int, str]:
        return (self.priority, self.name)

    def describe(self) -> str:
        hooks = ",".join(sorted(h.value for h in self.hooks)) or "-"
        return (
            f"endpoint={self.endpoint} hooks=[{hooks}] failure_policy={self.failure_policy.value} "
            f"timeout={format_duration(self.timeout)} priority={self.priority} answers={self.answers.value}"
        )

    def log_fields(self) -> Mapping[str, object]:
        """The registration as log fields (shared: read, not changed)."""
        return self._log_fields

    @functools.cached_property
    def _log_fields(self) -> dict[str, object]:
        # Made once: every hook call's log fields start from it.
        return {
            "hook_file": self.name,
            "hook_endpoint": self.endpoint,
            "hook_points": sorted(h.value for h in self.hooks),
            "hook_failure_policy": self.failure_policy.value,
            "hook_timeout": self.timeout,
            "hook_priority": self.priority,
            "hook_answers": self.answers.value,
        }


# --------------------------------------------------------------------------- parsing


class _Invalid(Exception):
    """A key's value is refused; each argument is a problem, word for word."""


def _endpoint(value: object) -> str:
    if not isinstance(value, str):
        raise _Invalid(f'"{KEY_ENDPOINT}" must be a string, got {_json_type(value)}')
    if not value.strip():
        raise _Invalid(f'"{KEY_ENDPOINT}" is empty')
    if not os.path.isabs(value):
        raise _Invalid(f'"{KEY_ENDPOINT}" must be an absolute socket path, got {shown(value)}')
    if "\x00" in value:
        raise _Invalid(f'"{KEY_ENDPOINT}" contains a NUL byte')
    try:
        encoded = value.encode()
    except UnicodeEncodeError:
        raise _Invalid(f'"{KEY_ENDPOINT}" is not a valid UTF-8 path: {shown(value)}') from None
    if len(encoded) > MAX_SOCKET_PATH:
        raise _Invalid(f'"{KEY_ENDPOINT}" is {len(encoded)} bytes long; a unix socket path has at most {MAX_SOCKET_PATH}')
    problem = dial_problem(value)
    if problem is not None:
        raise _Invalid(f'"{KEY_ENDPOINT}" {shown(value)}: {problem}')
    return value


def _failure_policy(value: object) -> FailurePolicy:
    if value is None or value == "":
        # Koordinator's PolicyNone: errors are ignored, like "Ignore".
        return FailurePolicy.IGNORE
    return _one_of(FailurePolicy, KEY_FAILURE_POLICY, value)


_E = TypeVar("_E", bound=enum.Enum)


def _one_of(kind: type[_E], key: str, value: object) -> _E:
    """The member of the string enum ``kind`` that ``value`` names."""
    if not isinstance(value, str):
        raise _Invalid(f'"{key}" must be a string, got {_json_type(value)}')
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(repr(member.value) for member in kind)
        raise _Invalid(f'unknown "{key}" {shown(value)} (allowed: {allowed})') from None


# Hook points Koordinator declares and koord-runtime-proxy never calls; koordlet
# lists them (PreRemoveRunPodSandbox, for its resctrl and GPU plugins). Accepted,
# so that koordlet's file registers its other hooks, and never called, as there.
NEVER_CALLED_HOOKS = frozenset({"PreRemoveRunPodSandbox"})


def _runtime_hooks(value: object) -> frozenset[HookType]:
    if value is None:  # Koordinator accepts a server registered for nothing
        return frozenset()
    if not isinstance(value, list):
        raise _Invalid(f'"{KEY_RUNTIME_HOOKS}" must be a list of hook names, got {_json_type(value)}')
    hooks: set[HookType] = set()
    unknown: list[str] = []
    wrong = ""  # the first entry not a string's type: named with the unknown names, a file is fixed in one pass
    for item in value:
        if not isinstance(item, str):
            wrong = wrong or _json_type(item)
            continue
        if item in NEVER_CALLED_HOOKS:
            continue
        try:
            hooks.add(HookType(item))
        except ValueError:
            unknown.append(item)  # each named: a file is fixed in one pass
    problems = [f'"{KEY_RUNTIME_HOOKS}" entries must be strings, got {wrong}'] if wrong else []
    if unknown:
        allowed = ", ".join(h.value for h in HookType)
        distinct = list(dict.fromkeys(unknown))
        names = ", ".join(shown(item) for item in distinct[:10])
        more = f" and {len(distinct) - 10} more" if len(distinct) > 10 else ""
        plural = "s" if len(distinct) > 1 else ""
        problems.append(f"unknown runtime hook{plural} {names}{more} (allowed: {allowed})")
    if problems:
        raise _Invalid(*problems)
    return frozenset(hooks)


def _timeout(value: object) -> float:
    if not isinstance(value, str):
        raise _Invalid(f'"{KEY_TIMEOUT}" must be a duration string like "2s" or "500ms", got {_json_type(value)}')
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise _Invalid(f'bad "{KEY_TIMEOUT}": {exc}') from None
    if seconds <= 0:
        raise _Invalid(f'bad "{KEY_TIMEOUT}": {shown(value)} must be greater than zero')
    if seconds > MAX_TIMEOUT:
        raise _Invalid(f'bad "{KEY_TIMEOUT}": {shown(value)} is more than the limit of {MAX_TIMEOUT:g}s')
    return seconds


def _priority(value: object) -> int:
    # bool is an int subclass in Python; JSON true/false is not a priority.
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Invalid(f'"{KEY_PRIORITY}" must be an integer, got {_json_type(value)} {shown(value)}')
    return value


def _answers(value: object) -> Answers:
    return _one_of(Answers, KEY_ANSWERS, value)


@dataclass(frozen=True)
class _Key:
    """One key of a hook file and the :class:`HookServerConfig` field it fills."""

    name: str
    field: str
    validate: Callable[[object], object]  # returns the field's value or raises _Invalid
    missing: str | None = None  # required key: the reason when it is absent or null
    default: object = None  # optional key: the value when it is absent

    def read(self, doc: Mapping[str, object]) -> object:
        if self.missing is not None:
            if doc.get(self.name) is None:
                raise _Invalid(self.missing)
            return self.validate(doc[self.name])
        # An optional key present as null is its validator's call (Koordinator
        # reads a null policy or hook list as unset; a null timeout is an error).
        return self.validate(doc[self.name]) if self.name in doc else self.default


# Checked in this order; every refused key is in the file's reason, in this order.
_KEYS: tuple[_Key, ...] = (
    _Key(KEY_ENDPOINT, "endpoint", _endpoint, missing=f'missing "{KEY_ENDPOINT}" (the hook server\'s unix socket path)'),
    _Key(KEY_FAILURE_POLICY, "failure_policy", _failure_policy, default=FailurePolicy.IGNORE),
    _Key(KEY_RUNTIME_HOOKS, "hooks", _runtime_hooks, default=frozenset()),
    _Key(KEY_TIMEOUT, "timeout", _timeout, default=DEFAULT_TIMEOUT),
    _Key(KEY_PRIORITY, "priority", _priority, default=DEFAULT_PRIORITY),
    _Key(KEY_ANSWERS, "answers", _answers),  # absent: default_answers(file name)
)
KNOWN_KEYS = frozenset(key.name for key in _KEYS)


def parse_hook_document(path: Path, doc: object) -> HookServerConfig:
    """Validate an already-decoded hook file document; ``path`` names it in errors.

    Raises :class:`HookConfigError`.  This is :func:`parse_hook_file` without
    the reading and permission checks (used e.g. to validate before writing).
    """
    path = Path(path)
    if not isinstance(doc, dict):
        raise HookConfigError(path, f"top-level JSON value must be an object, got {_json_type(doc)}")
    keyed = match_keys(doc, KNOWN_KEYS)  # Koordinator's in any case, as koord-runtime-proxy (hookkeys.py)
    found = keyed.values
    values: dict[str, object] = {}
    problems: list[str] = []
    for key in _KEYS:  # every key judged: a file is fixed in one pass
        problems += [why for name, why in keyed.problems if name == key.name]  # a value overridden, of a type Go refuses
        try:
            values[key.field] = key.read(found)
        except _Invalid as exc:
            problems += exc.args
    if problems:
        raise HookConfigError(path, "; ".join(problems), problems=tuple(problems))

    unknown = sorted(set(found) - KNOWN_KEYS)
    if unknown:
        logger.debug(
            "hook config %s: ignoring unknown keys %s",
            path.name,
            unknown,
            extra={"hook_file": path.name, "hook_unknown_keys": unknown},
        )
    if values["answers"] is None:
        values["answers"] = default_answers(path.name)
    listed = found.get(KEY_RUNTIME_HOOKS) or ()
    # (a valid list of names: read above; found's values are objects to mypy)
    values["uncalled_hooks"] = frozenset(h for h in listed if h in NEVER_CALLED_HOOKS)  # type: ignore[attr-defined]
    return HookServerConfig(name=path.name, key_notes=keyed.notes, **values)  # type: ignore[arg-type]  # values: each checked above; objects to mypy


def parse_hook_file(path: Path, *, check_permissions: bool = True, follow_symlinks: bool = True) -> HookServerConfig:
    """Read, check and validate one hook file.

    Raises :class:`HookConfigError` (with the file and the reason) when the file
    cannot be read (a symlink, unless ``follow_symlinks``), is unsafe
    (``check_permissions``), or is invalid.  The directory's own safety is
    checked by the registry, not here.
    """
    path = Path(path)
    data, owner_uid = read_hook_file(path, check_permissions, follow_symlinks=follow_symlinks)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise HookConfigError(path, f"not valid UTF-8: {exc}") from None
    if not text.strip():
        raise HookConfigError(path, "file is empty")
    try:
        doc = json.loads(text, object_pairs_hook=object_pairs)  # a key given twice is seen
    except json.JSONDecodeError as exc:
        raise HookConfigError(path, f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise HookConfigError(path, "invalid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise HookConfigError(path, f"invalid JSON: {exc}") from None
    return dataclasses.replace(parse_hook_document(path, doc), owner_uid=owner_uid)
