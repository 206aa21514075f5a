"""The live set of hook servers of one hook directory: snapshot, reload, watch.

Only regular ``*.json`` files directly in the directory (symlinks to regular
files included) are considered; hidden files (``.name.json``, e.g. editors'
lock files) and sub-directories are skipped.  Each file is read and checked by
:mod:`.hookfile`.  A directory that turns unsafe (group/other-writable, not
owned by root) is not read at all: the last good hook set stays in force (none
at start-up), an error is logged on each rescan and ``runtime_proxy_hook_dir_refused``
is 1 until the directory is safe again. So does one that cannot be stat'ed or
listed for a moment (EMFILE, EIO): dropping its hooks would let calls pass
their Fail hooks, and one replaced by a file (a broken config, as a broken
hook file is). A missing directory means no hooks.

Rescans cost what changed: a file whose stat identity (inode, mtime, ctime,
size, mode, owner; for a symlink also its target) is unchanged since the last
scan is not read again, unless the watcher named it in a change event or
:meth:`HookRegistry.reload` (which re-reads everything) is called; a file that
could not be read (as opposed to one read and found bad) is read again at
every rescan. A periodic rescan of a directory whose fingerprint (its stat,
its entries' names, their stat identities) is the one a rescan that read
nothing left costs just that fingerprint. Every ``FULL_REREAD_SECONDS`` a
periodic rescan reads every file, whatever its stat says.

Threading: a registry belongs to the thread that creates it, in the proxy the
event loop's thread, where :meth:`HookRegistry.watch` reloads.  Change
callbacks run there, synchronously, and consumers rely on that (the dispatcher
closes a removed server's channel on the running loop), so ``reload``,
``on_change`` and ``watch`` refuse any other thread.  ``snapshot`` and
``servers_for`` may be read from anywhere: a snapshot is immutable and is
replaced in one assignment.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from ..metrics import HookConfigMetrics
from .dirwatch import WatchSettings, directory_fingerprint, file_identity, watch_directory
from .hookdir import DirectoryState, Inspection, inspect_directory, list_hook_files
from .hookfile import DEFAULT_HOOK_DIR, HookConfigError, HookServerConfig, parse_hook_file
from .oddities import warn_if_odd
from .points import HookType
from .reloadnotes import ReloadNotes

__all__ = ["ChangeCallback", "HookRegistry", "HookSnapshot", "HookSource", "ReloadResult"]

logger = logging.getLogger(__name__)

# The periodic safety rescan reads every file again once in this many seconds,
# whatever its stat says: a file rewritten twice within one tick of the
# filesystem's clock has, after the second write, the stat (mtime, ctime,
# size) a rescan between the two saw, and nothing else would read it again.
FULL_REREAD_SECONDS = 300.0


def _by_hook(servers: Iterable[HookServerConfig]) -> Mapping[HookType, tuple[HookServerConfig, ...]]:
    ordered = sorted(servers, key=lambda s: s.sort_key)
    return MappingProxyType({hook: tuple(s for s in ordered if hook in s.hooks) for hook in HookType})


@dataclass(frozen=True, eq=False)
class HookSnapshot:
    """An immutable view of the registered hook servers at one point in time."""

    servers: Mapping[str, HookServerConfig] = field(default_factory=lambda: MappingProxyType({}))
    generation: int = 0  # incremented each time the set of configs changes

    # Per hook point, its servers ordered by (priority, file name): made once per snapshot.
    by_hook: Mapping[HookType, tuple[HookServerConfig, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "servers", MappingProxyType(dict(sorted(self.servers.items()))))
        object.__setattr__(self, "by_hook", _by_hook(self.servers.values()))

    def servers_for(self, hook: HookType) -> tuple[HookServerConfig, ...]:
        """Hook servers registered for ``hook``, ordered by (priority, file name)."""
        return self.by_hook[hook]

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
    ``directory_error`` is set when the directory itself is unusable: missing
    (no hooks at all), unsafe (``directory_unsafe``), not a directory or not
    readable now; in those three nothing is read, the last good snapshot
    stays in force (``directory_kept``) and so do the rejections last read.
    """

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    rejected: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    kept: tuple[str, ...] = ()
    directory_error: str | None = None
    directory_unsafe: bool = False
    directory_kept: bool = False  # the directory is not read: the hooks loaded before stay in force
    snapshot: HookSnapshot = field(default_factory=HookSnapshot)

    @property
    def modified(self) -> bool:
        """True when the effective set of hook configs changed."""
        return bool(self.added or self.changed or self.removed)


ChangeCallback = Callable[[HookSnapshot], object]


@runtime_checkable  # a stand-in's (hooks.chaincheck) test checks it has every member
class HookSource(Protocol):
    """What a dispatcher reads of the registered hook files: a
    :class:`HookRegistry`, or a stand-in holding fixed ones."""

    @property
    def snapshot(self) -> HookSnapshot: ...

    def servers_for(self, hook: HookType) -> tuple[HookServerConfig, ...]: ...

    def on_change(self, callback: ChangeCallback) -> object: ...


class HookRegistry:
    """The current set of hook server configs of one hook directory.

    Threading as in the module's docstring; change callbacks run synchronously
    in :meth:`reload` and must be quick and non-blocking.
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
        metrics: HookConfigMetrics | None = None,
    ) -> None:
        self._directory = Path(directory)
        self._check_permissions = check_permissions
        self._watch_settings = WatchSettings(debounce_ms, step_ms, resync_interval, dir_poll_interval, error_backoff)
        self._snapshot = HookSnapshot()
        self._last_reload = ReloadResult()
        self._owner = threading.current_thread()
        self._callbacks: list[ChangeCallback] = []
        self._notes = ReloadNotes(self._directory)  # its log lines, each problem once until it changes
        self._metrics = metrics
        # Per file name: (stat identity, config or None, rejection reason or None) of its last parse.
        self._parsed: dict[str, tuple[tuple[object, ...], HookServerConfig | None, str | None]] = {}
        # A periodic rescan that read no file and changed nothing: the directory's fingerprint then, and its result.
        self._quiet: tuple[tuple[object, ...], ReloadResult] | None = None
        self._full_every = max(1, round(FULL_REREAD_SECONDS / max(resync_interval, 0.001)))  # in periodic rescans
        self._periodic_left = self._full_every  # until the next one that reads every file

    def _refuse_foreign_thread(self, what: str) -> None:
        # Callbacks run on another thread would find no event loop (the
        # dispatcher would forget a removed server's channel, never closing it).
        if threading.current_thread() is not self._owner:
            raise RuntimeError(
                f"HookRegistry.{what}() called from thread {threading.current_thread().name!r}; "
                f"the registry of {self._directory} belongs to thread {self._owner.name!r} "
                "(its event loop's thread): call it there, e.g. with loop.call_soon_threadsafe"
            )

    # -- read side (hot path, lock-free, any thread) ----------------------------

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def snapshot(self) -> HookSnapshot:
        return self._snapshot

    @property
    def last_reload(self) -> ReloadResult:
        """What the latest rescan found (files rejected, a directory problem): for `status`."""
        return self._last_reload

    def servers_for(self, hook: HookType) -> tuple[HookServerConfig, ...]:
        """Hook servers registered for ``hook``, ordered by (priority, file name)."""
        # The snapshot's servers_for, inline: asked several times per hooked call.
        return self._snapshot.by_hook[hook]

    # -- subscriptions ---------------------------------------------------------

    def on_change(self, callback: ChangeCallback) -> Callable[[], None]:
        """Call ``callback(snapshot)`` after every reload that changed the configs.

        Returns a function that unsubscribes the callback.
        """
        self._refuse_foreign_thread("on_change")
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return unsubscribe

    # -- reload ------------------------------------------------------------------

    def reload(self) -> ReloadResult:
        """Rescan the directory and atomically replace the snapshot; see :class:`ReloadResult`.

        Call it on the registry's own thread (the event loop's; :meth:`watch`
        does): from any other thread it raises ``RuntimeError`` and changes nothing.
        """
        self._refuse_foreign_thread("reload")
        return self._reload(reread=None, periodic=False)

    def rescan(self, changed: Iterable[str] = ()) -> ReloadResult:
        """What the watcher does: like :meth:`reload`, but a file is read again
        only when named in ``changed`` or when its stat identity changed.

        Without ``changed`` it is the periodic safety rescan, which also does
        not repeat the error line of an unchanged unsafe directory.
        """
        self._refuse_foreign_thread("rescan")
        names = frozenset(changed)
        return self._reload(names, periodic=not names)

    def _reload(self, reread: frozenset[str] | None, periodic: bool) -> ReloadResult:
        """Rescan; re-read the files named in ``reread`` (all when None) and the changed ones."""
        if periodic:
            self._periodic_left -= 1
            if self._periodic_left <= 0:
                reread = None  # see FULL_REREAD_SECONDS
        if reread is None:
            self._periodic_left = self._full_every
        result = self._last_reload = self._rescan(reread, periodic)
        if result.modified:
            for callback in list(self._callbacks):  # a callback may unsubscribe
                try:
                    callback(result.snapshot)
                except Exception:
                    logger.exception(
                        "hook config change callback %r failed", callback, extra={"hook_dir": str(self._directory)}
                    )
        return result

    def _rescan(self, reread: frozenset[str] | None, periodic: bool) -> ReloadResult:
        # Taken before anything is read: a change made during the scan is seen at the next.
        fingerprint = directory_fingerprint(self._directory) if periodic and reread is not None else None
        if fingerprint is not None and self._quiet is not None and self._quiet[0] == fingerprint:
            # Nothing a scan would look at changed since one that found nothing to do: the
            # directory is usable still, with nothing to note (ReloadNotes) and its gauges 0.
            if self._metrics is not None:
                self._metrics.dir_refused.set(0)
                self._metrics.dir_kept.set(0)
            return self._quiet[1]
        self._quiet = None
        read_any = False
        old = self._snapshot
        found = inspect_directory(self._directory, self._check_permissions)
        unsafe = found.state is DirectoryState.UNSAFE
        if self._metrics is not None:
            self._metrics.dir_refused.set(1 if unsafe else 0)
        candidates: list[Path] = []
        problem: str | None
        if found.state is DirectoryState.USABLE:
            try:
                candidates = list_hook_files(self._directory)
            except OSError as exc:  # EMFILE, EIO...: the files are still there
                problem = f"cannot list hook directory {self._directory}: {exc.strerror or exc}"
                found = Inspection(DirectoryState.UNREADABLE, problem, logging.ERROR)
        problem = found.problem
        if self._metrics is not None:
            self._metrics.dir_kept.set(1 if found.keeps_last_good else 0)
        if found.keeps_last_good:
            # Unsafe: whoever can write the directory could have put anything
            # in it. Unreadable: nothing says its files changed, and dropping
            # them would let calls pass their Fail hooks. A file in its place:
            # a broken hook config, kept over as a broken hook file is. Each
            # way, read nothing and keep what was loaded last. An unsafe one
            # is logged at each rescan a change brings (someone writes there),
            # the others once per problem, not at each event.
            self._notes.kept_directory(problem or "", periodic or not unsafe, found.until, old.servers)
            last_reload = self._last_reload  # its files' rejections stand as read last: `status` lists them still
            return ReloadResult(
                rejected=last_reload.rejected, kept=last_reload.kept, directory_error=problem, directory_unsafe=unsafe,
                directory_kept=True, snapshot=old,
            )
        self._notes.directory_problem(problem, found.level)

        new_servers: dict[str, HookServerConfig] = {}
        rejected: dict[str, str] = {}
        kept: list[str] = []
        parsed: dict[str, tuple[tuple[object, ...], HookServerConfig | None, str | None]] = {}
        for path in candidates:
            name = path.name
            identity = file_identity(path)
            last = self._parsed.get(name)
            fresh = reread is None or name in reread
            cached = not fresh and last is not None and identity is not None and last[0] == identity
            if cached and last is not None:
                _, config, reason = last  # unchanged since its last parse: not read again
            else:
                read_any = True
                config, reason, transient = self._parse(path)
                if config is None and reason is None:
                    continue  # deleted since the directory was listed: it is simply gone
                if transient:
                    identity = None  # not remembered: read again at the next rescan
            if identity is not None:
                parsed[name] = (identity, config, reason)
            if config is None:
                assert reason is not None
                rejected[name] = reason
                previous = old.servers.get(name)
                if previous is not None:
                    new_servers[name] = previous
                    kept.append(name)
                if not cached:  # an unchanged bad file was logged when it was read
                    self._notes.rejection(path, reason, previous)
                continue
            warn_if_odd(config, old.servers.get(name))
            new_servers[name] = config
            self._notes.accepted(name)
        self._parsed = parsed
        if self._metrics is not None:
            self._metrics.files_rejected.set(len(rejected))
        self._notes.keep_rejections(rejected)
        added, changed, removed = self._notes.changes(old.servers, new_servers, self._last_reload.rejected, rejected)

        snapshot = old
        # The same registrations, a key spelt otherwise: in force with the notes warned of, else warned of at each rescan.
        renoted = any(old.servers[n].key_notes != config.key_notes for n, config in new_servers.items() if n in old.servers)
        if added or changed or removed or renoted:  # publish the new snapshot in one assignment
            generation = old.generation + (1 if added or changed or removed else 0)
            snapshot = self._snapshot = HookSnapshot(servers=new_servers, generation=generation)
        result = ReloadResult(
            added=added, changed=changed, removed=removed, rejected=MappingProxyType(rejected), kept=tuple(kept),
            directory_error=problem, snapshot=snapshot,
        )
        if fingerprint is not None and not read_any and problem is None and snapshot is old:
            self._quiet = (fingerprint, result)  # the same scan again would read, log and change nothing
        return result

    def _parse(self, path: Path) -> tuple[HookServerConfig | None, str | None, bool]:
        """(config, None, False), (None, why it is rejected, whether that may
        pass by itself), or (None, None, False) when it is gone."""
        try:
            return parse_hook_file(path, check_permissions=self._check_permissions), None, False
        except Exception as exc:  # one odd file must never stop the others from loading
            if not os.path.lexists(path):
                return None, None, False
            if isinstance(exc, HookConfigError):
                return None, exc.reason, exc.transient
            logger.debug("unexpected error reading hook config", exc_info=True, extra={"hook_file": path.name})
            return None, f"cannot be read: {type(exc).__name__}: {exc}", True

    def _safe_reload(self, reread: frozenset[str] | None) -> ReloadResult | None:
        """For the watcher: None re-reads everything, an empty set is the periodic rescan."""
        try:
            return self._reload(reread, periodic=reread is not None and not reread)
        except Exception:
            logger.exception("reloading hook directory %s failed", self._directory, extra={"hook_dir": str(self._directory)})
            return None

    # -- watching ------------------------------------------------------------------

    async def watch(self, stop: asyncio.Event) -> None:
        """Rescan on every change of the directory until ``stop`` is set; see :mod:`.dirwatch`.

        A change event re-reads the files it names (and any whose stat
        changed); the periodic safety rescan reads only files whose stat
        changed. Errors are logged, never raised.
        """
        self._refuse_foreign_thread("watch")
        await watch_directory(self._directory, self._safe_reload, self._watch_settings, stop)
