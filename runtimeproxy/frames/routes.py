"""How a frames connection carries each call, decided from the router's plan.

A call is relayed verbatim only when the grpc data path would itself relay
it unchanged to the runtime socket: a version the backend serves natively, no
stage (hooks, field checks) on the method or none with work for this call
(``StageProvider.needed``), the runtime (not a separate image) backend. A
unary call in a native version whose method has stages with work is *hooked*
in place (hooked.py): the same stages, on the same backend connection.
Everything else, health, refusals and translated versions included, is
diverted to the proxy's own grpc.aio server, so it behaves exactly as on the
grpc path.

The routes stay while the runtime is lost and not probed again: its calls
are relayed on each connection's fresh runtime connection as before, served
as soon as it listens. The router's channel may sit in its reconnect backoff
then (UNAVAILABLE at once, up to channelopts.RECONNECT_MAX_S and its jitter:
0.6 s), and a relayed call's UNIMPLEMENTED (a version the restarted runtime
dropped) cannot be rewritten here anyway:
its trailers are HPACK-coded for the client's decoder as they are. It brings
the re-probe forward instead (``runtime_unimplemented``: Backend.probe_soon).
An UNKNOWN or UNAVAILABLE "server is not initialized yet" (containerd just
started; 2.x answers UNAVAILABLE) tells the runtime's Unready
(``runtime_failed_status``): hooked calls are then diverted,
and refused before their hooks, until it serves (cripath/unready.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..cripath import methods
from ..cripath.backend import CRI_VERSIONS
from ..cripath.router import Router
from ..cripath.stage import Stage, StageProvider
from ..cripath.unready import not_initialized
from ..cripath.versions import VersionPlan


@dataclass(frozen=True)
class Staged:
    """A method's stages, and the providers that gave them (asked per call)."""

    method: str
    stages: tuple[Stage, ...]
    providers: tuple[StageProvider, ...]

    # Loops, not any()/all() over a generator: both are asked at every hooked call.

    def needed(self) -> bool:
        """Whether a call starting now has work in any of the stages."""
        for provider in self.providers:
            if provider.needed(self.method):
                return True
        return False

    def sends_unchanged(self) -> bool:
        """Whether a call starting now may go to the runtime as it is read (its stages run beside)."""
        for provider in self.providers:
            if not provider.sends_unchanged(self.method):
                return False
        return True


def plan_paths(
    plan: VersionPlan, providers: Sequence[StageProvider], image_apart: bool
) -> tuple[frozenset[str], dict[str, Staged]]:
    """The paths relayed verbatim, and those with stages."""
    fast: set[str] = set()
    hooked: dict[str, Staged] = {}
    for version in CRI_VERSIONS:
        if plan.routes.get(version) != version:
            continue  # not served, or translated (a rewritten :path)
        for path, info in methods.METHODS[version].items():
            if image_apart and info.service == "ImageService":
                continue
            if info.client_streaming or info.server_streaming:
                fast.add(path)
                continue
            given = [(p, stage) for p in providers if (stage := p.stage_for(info.name, version, version)) is not None]
            if given:
                hooked[path] = Staged(info.name, tuple(s for _, s in given), tuple(p for p, _ in given))
            else:
                fast.add(path)
    return frozenset(fast), hooked


class RouterRoutes:
    """The frames connections' view of the router, rebuilt when its plan changes."""

    def __init__(self, router: Router, image_apart: bool) -> None:
        self._router = router
        self._unready = router.unready
        self._image_apart = image_apart
        self._plan: VersionPlan | None = None
        self._fast: frozenset[str] = frozenset()
        self._hooked: dict[str, Staged] = {}
        self._recorders: dict[str, Callable[[str, float], None]] = {}
        self._unary = frozenset(
            path
            for version in CRI_VERSIONS
            for path, info in methods.METHODS[version].items()
            if not (info.client_streaming or info.server_streaming)
        )

    def ready(self) -> bool:
        return self._router.plan is not None

    def _current(self) -> VersionPlan | None:
        plan = self._router.plan
        if plan is not None and plan is not self._plan:
            self._fast, self._hooked = plan_paths(plan, self._router.stages, self._image_apart)
            self._plan = plan
        return plan

    def measure(self, path: str) -> Callable[[str, float], None] | None:
        """Count a call on ``path`` as started; the function that records its end
        (code, seconds), as the router's measured handlers do; None if unmeasured."""
        sink = self._router.calls
        if sink is None:
            return None
        record = self._recorders.get(path)
        if record is None:
            ref = methods.parse_method(path)
            if ref is None:
                return None
            record = sink.recorder(ref)  # invented names share the "unknown" one
            if ref.qualified_name in methods.KNOWN_METHODS:  # cached by path: a bounded set (invented paths are not)
                self._recorders[path] = record
        sink.started()
        return record

    def hooked(self, path: str) -> tuple[Stage, ...] | None:
        """The stages of a call hooked in place, or None. None too while the
        runtime does not serve (cripath/unready.py): the call is diverted,
        and the router's gate refuses it before its hooks."""
        staged = self._hooked.get(path) if self._current() is not None else None
        return None if staged is None or self._unready.reason is not None else staged.stages

    def sends_unchanged(self, path: str) -> bool:
        """Whether a hooked call's request may go to the runtime as it is
        read, its stages running beside the runtime's work."""
        staged = self._hooked.get(path)
        return staged is not None and staged.sends_unchanged()

    def fast(self, path: str) -> bool:
        plan = self._current()
        if plan is None:
            return False
        if path in self._fast:
            return True
        staged = self._hooked.get(path)
        if staged is not None:  # relayed when no stage has work for it now
            return not staged.needed()
        ref = methods.parse_method(path)
        # A method our protos lack, in a version served natively: the router
        # relays it as a byte stream, as the backend would see it here.
        return (
            ref is not None
            and path not in methods.METHODS.get(ref.version, {})
            and plan.routes.get(ref.version) == ref.version
            and not (self._image_apart and ref.service == "ImageService")
        )

    def unary(self, path: str) -> bool:
        return path in self._unary

    def runtime_unimplemented(self) -> None:
        self._router.runtime_unimplemented()

    def runtime_failed_status(self, status: int, message: str) -> None:
        if not_initialized(status, message):
            self._unready.saw(f"it answers {message!r}")
