"""The one owner of the proxy's background tasks.

Every task the proxy runs beside its calls (the backend monitor, the hook
directory watcher, state rebuilds and resyncs, post hooks, calls finished
after their client left, health updates) is started here, under a name, with what should
happen if it dies:

* a *service* (monitor, watcher) must always run: when it dies or ends it
  is logged and restarted with backoff; when it keeps dying, the supervisor
  fails, and ``serve`` stops the proxy and exits non-zero (unless its
  ``Restart`` says never to give up: one the proxy serves without, as the
  separate image service's watch, whose failure marks that side down);
  should the restarting itself fail (a bug), the supervisor fails too, as
  nothing would run the service any more;
* a *one-shot* task is logged if it fails; a critical one (health updates)
  fails the supervisor instead, since the proxy must never keep serving
  with routing or health it can no longer update;
* at shutdown, one-shot tasks that finish calls are waited for (``drain``),
  then the named tasks are stopped in the order the caller gives.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Restart:
    """How a service is restarted: backoff doubling from ``first_delay`` up
    to ``max_delay``; after ``attempts`` failures in a row it is given up
    (None: never; it is restarted every ``max_delay`` for as long as it dies).
    A run that lasted ``healthy_after`` seconds starts the count afresh."""

    first_delay: float = 0.1
    max_delay: float = 5.0
    attempts: int | None = 5
    healthy_after: float = 60.0

    def delay(self, failures: int) -> float:
        # The exponent is capped: a service restarted forever reaches failure
        # counts whose float power overflows (2.0 ** 1024 raises OverflowError),
        # and by 2 ** 64 any first_delay > 0 is past any max_delay.
        return min(self.max_delay, self.first_delay * 2.0 ** min(failures - 1, _MAX_DOUBLINGS))


_MAX_DOUBLINGS = 64


class TaskName:
    """The proxy's background tasks."""

    MONITOR = "backend-monitor"
    IMAGE_MONITOR = "image-backend-monitor"  # a separate image service's (cripath/imagewatch.py)
    WATCHER = "hook-dir-watch"
    REBUILD = "state-rebuild"
    HEALTH = "health-update"
    FINISH = "finish-hooked-call"
    POST_HOOK = "post-hook"
    MEMORY = "memory-release"
    RECHECK = "recheck-removal"
    RESYNC = "state-resync"


# Shutdown, once calls are drained and recorded (FINISH and POST_HOOK are
# drained, not stopped): nothing may still read the backend or react to it
# when its channels close.
STOP_ORDER = (
    TaskName.WATCHER, TaskName.REBUILD, TaskName.RESYNC, TaskName.RECHECK, TaskName.MONITOR,
    TaskName.IMAGE_MONITOR, TaskName.HEALTH,
)


class TaskFailed(RuntimeError):
    """A task the proxy cannot serve without kept failing."""


class _OneShot(NamedTuple):  # (one per post hook: a frozen dataclass costs several times as much to make)
    name: str
    drain: bool
    critical: bool
    fields: dict[str, object]


class Supervisor:
    def __init__(self) -> None:
        self._services: dict[asyncio.Task[None], str] = {}
        self._oneshots: dict[asyncio.Task[Any], _OneShot] = {}
        self.failed = asyncio.Event()
        self.error: TaskFailed | None = None

    # Starting

    def keep_running(self, name: str, run: Callable[[], Awaitable[None]], restart: Restart = Restart()) -> None:
        """Run ``run()`` until stopped, restarting it when it dies or returns."""
        task = asyncio.get_running_loop().create_task(self._keep(name, run, restart), name=name)
        self._services[task] = name
        task.add_done_callback(self._service_done)

    def spawn(
        self,
        name: str,
        work: Coroutine[Any, Any, T],
        *,
        drain: bool = False,
        critical: bool = False,
        fields: Mapping[str, object] | None = None,
    ) -> asyncio.Task[T]:
        """Run ``work`` once. ``drain``: shutdown waits for it instead of
        cancelling it. ``critical``: if it fails, the supervisor fails.
        ``fields`` go into the log line if it fails."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._oneshots[task] = _OneShot(name, drain, critical, dict(fields or {}))  # also keeps the task alive
        task.add_done_callback(self._oneshot_done)
        return task

    async def _keep(self, name: str, run: Callable[[], Awaitable[None]], restart: Restart) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            started = loop.time()
            try:
                await run()
                error: BaseException = RuntimeError("returned while it should run until stopped")
                log.error("background task ended", extra={"task": name})
            except asyncio.CancelledError as exc:
                # Only our own cancel stops the service: one raised out of run()
                # (a grpc.aio call on a closed channel, say) is a death, restarted.
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise
                error = exc
                log.error("background task died", extra={"task": name, "error": repr(exc)}, exc_info=exc)
            except Exception as exc:
                error = exc
                log.exception("background task died", extra={"task": name, "error": repr(exc)})
            failures = 1 if loop.time() - started >= restart.healthy_after else failures + 1
            if restart.attempts is not None and failures > restart.attempts:
                self._fail(name, error, failures)
                return
            delay = restart.delay(failures)
            log.warning("restarting background task", extra={"task": name, "attempt": failures, "retry_in_s": delay})
            await asyncio.sleep(delay)

    # Faults

    def _service_done(self, task: asyncio.Task[None]) -> None:
        name = self._services.pop(task, None)
        if task.cancelled() or task.exception() is None:
            return
        # _keep itself failed (a bug outside its try): nothing restarts the
        # service from here, so the proxy must not go on as if it ran.
        error = task.exception()
        assert error is not None
        self._fail(name or task.get_name(), error, 1, "background task's restarts failed; nothing restarts it")

    def _oneshot_done(self, task: asyncio.Task[Any]) -> None:
        info = self._oneshots.pop(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        if info.critical:
            self._fail(info.name, error, 1)  # type: ignore[arg-type]  # not None: checked above (a call mypy does not narrow)
        else:
            log.error(
                "background task failed", extra={**info.fields, "task": info.name, "error": repr(error)}, exc_info=error
            )

    def _fail(
        self, name: str, error: BaseException, failures: int,
        why: str = "background task keeps failing; the proxy cannot go on without it",
    ) -> None:
        # One critical line per failure, with its traceback where one says more than the count.
        log.critical(why, extra={"task": name, "failures": failures, "error": repr(error)},
                     exc_info=error if error.__traceback__ is not None else None)
        if self.error is None:
            self.error = TaskFailed(f"background task {name!r} failed {failures} time(s): {error!r}")
        self.failed.set()

    # Stopping

    def running(self, name: str) -> list[asyncio.Task[Any]]:
        """The live tasks started under ``name``."""
        tasks = [t for t, n in self._services.items() if n == name]
        tasks += [t for t, info in self._oneshots.items() if info.name == name]
        return tasks

    def draining(self) -> list[str]:
        """The names of the one-shot tasks ``drain`` still waits for."""
        return sorted(info.name for info in self._oneshots.values() if info.drain)

    async def drain(self) -> None:
        """Wait for the one-shot tasks marked ``drain`` (those may start more)."""
        while pending := [t for t, info in self._oneshots.items() if info.drain]:
            await asyncio.wait(pending)

    async def stop(self, names: Iterable[str]) -> None:
        """Cancel the tasks of each name in turn, each name's done before the next."""
        for name in names:
            await _cancel(self.running(name))

    async def close(self) -> None:
        """Cancel whatever is left (after an orderly ``stop``, nothing should be)."""
        left = [*self._services, *self._oneshots]
        if left:
            log.debug("cancelling leftover background tasks", extra={"tasks": sorted(t.get_name() for t in left)})
        await _cancel(left)


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
