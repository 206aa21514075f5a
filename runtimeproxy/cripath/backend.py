"""The container runtime behind the proxy: channels and version probing.

The proxy listens before the backend is known. Until the first probe
succeeds, CRI calls are answered UNAVAILABLE (kubelet retries them). After a
backend restart the channel reconnects and the versions are probed again, so
an upgrade from a v1alpha2-only to a v1 runtime is noticed without restarting
the proxy.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError, Message
from grpc import aio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    wait_exponential,
)

from cri_api.v1 import api_pb2 as v1

from ..host.unixsocket import grpc_target
from ..outages import BACKEND, OutageLog
from . import lenient
from .methods import ApiVersion
from .registered import Budget, registered
from .unready import Unready, not_initialized, serves

log = logging.getLogger(__name__)

CRI_VERSIONS = (ApiVersion.V1, ApiVersion.V1ALPHA2)
PROBE_TIMEOUT = 2.0
# The least time from one probe to the next that a call's UNIMPLEMENTED
# brings forward (``probe_soon``): however many calls fail so, at most two probes a second.
PROBE_SOON_S = 0.5


class BackendUnavailable(Exception):
    pass


@dataclass(frozen=True)
class BackendInfo:
    versions: frozenset[ApiVersion]  # CRI versions whose Version call the backend answered
    runtime_name: str
    runtime_version: str

    def describe(self) -> str:
        return f"{self.runtime_name} {self.runtime_version} (CRI {', '.join(sorted(self.versions))})"


RuntimeInstance = tuple[int, int, int]


def runtime_instance(socket: Path) -> RuntimeInstance | None:
    """Which runtime process serves ``socket``, as far as the file tells: a
    runtime that starts creates its socket anew (new inode, new ctime)."""
    try:
        st = os.stat(socket)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def _text(answer: Message, name: str) -> str:
    """A Version answer's string field as text: read as bytes when it is not
    UTF-8 (lenient.py), its odd bytes escaped, the same at every probe."""
    value: str | bytes = getattr(answer, name)
    return value if isinstance(value, str) else value.decode("utf-8", "backslashreplace")


class Backend:
    """Channels to the runtime (and image) service, and what they speak."""

    def __init__(
        self,
        runtime_socket: Path,
        image_socket: Path | None,
        options: list[tuple[str, int | str]],
        probe_max_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runtime_socket = runtime_socket
        self.image_socket = image_socket or runtime_socket
        self.runtime_channel = aio.insecure_channel(grpc_target(runtime_socket), options=options)
        self.image_channel = (
            self.runtime_channel
            if self.image_socket == runtime_socket
            else aio.insecure_channel(grpc_target(self.image_socket), options=options)
        )
        self._probe_max_interval = probe_max_interval
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep  # between probes (tests: none)
        self._soon = asyncio.Event()  # probe_soon: the wait between probes ends early
        self._attempted = 0.0  # when the latest probe began (loop time)
        self.info: BackendInfo | None = None
        self.ready = asyncio.Event()
        self._listeners: list[Callable[[BackendInfo], None]] = []
        self._lost_listeners: list[Callable[[], None]] = []
        self._reconnect_listeners: list[Callable[[bool], None]] = []
        self.connected = False  # answered a probe, and its connection has not failed since
        self._instance: RuntimeInstance | None = None  # the runtime last probed
        # The backend's outage: from its loss, or at start its first failed
        # probe, to the probe that answers (keyed by its socket).
        self._outages = OutageLog(log, BACKEND, clock=clock)
        # Seen not to serve though it listens (containerd's CRI plugin still
        # loading): hooked calls are refused before their hooks (unready.py).
        self.unready = Unready(runtime_socket, lambda: serves(self.runtime_channel, PROBE_TIMEOUT))

    def on_change(self, listener: Callable[[BackendInfo], None]) -> None:
        """Called after every successful probe (at start and after each reconnect)."""
        self._listeners.append(listener)

    def on_lost(self, listener: Callable[[], None]) -> None:
        """Called when a connection to a probed backend fails (until it is probed again)."""
        self._lost_listeners.append(listener)

    def on_reconnect(self, listener: Callable[[bool], None]) -> None:
        """Called once a channel that came back to READY has been looked at:
        True if it was taken as a new runtime (lost, then probed again), False
        for the runtime it left (an idle channel reconnecting)."""
        self._reconnect_listeners.append(listener)

    def unprobed(self) -> bool:
        """Whether the runtime was lost (its connection failed, a probe failed,
        or a new one answers) and is not probed again yet: what it serves is
        not known, so its routing may be stale."""
        return not self.connected

    def probe_soon(self) -> None:
        """A call got UNIMPLEMENTED from the runtime. If it is lost and not
        probed again, the runtime it answers may be a restarted one without
        the CRI version the call is routed in (containerd 2 dropped
        v1alpha2): a probe waiting to retry (the runtime answered, but was
        not initialised yet) goes now, PROBE_SOON_S after the last at the
        soonest, not after its backoff (up to ``probe_max_interval``). A
        probed runtime's UNIMPLEMENTED is a method it lacks: nothing to do."""
        if not self.connected:
            self._soon.set()

    async def _pause(self, delay: float) -> None:
        """The wait before the next probe: ``delay``, unless ``probe_soon``
        (since the last probe began) ends it early."""
        timer = asyncio.ensure_future(self._sleep(delay))
        soon = asyncio.ensure_future(self._soon.wait())
        try:
            await asyncio.wait((timer, soon), return_when=asyncio.FIRST_COMPLETED)
            if not timer.done():
                gap = PROBE_SOON_S - (asyncio.get_running_loop().time() - self._attempted)
                if gap > 0:
                    await asyncio.wait((timer,), timeout=gap)
        finally:
            timer.cancel()
            soon.cancel()

    def channel_for(self, service: str) -> aio.Channel:
        return self.image_channel if service == "ImageService" else self.runtime_channel

    async def probe_once(self) -> BackendInfo:
        """Ask Version in every CRI version (UNIMPLEMENTED means 'not served'),
        then whether the runtime serves calls yet. v1alpha2, once v1 answered,
        is first asked without a call of its own (registered.py: containerd
        1.7 records a deprecation at a v1alpha2 call); a v1alpha2-only
        runtime's Version is still asked, its name and version are needed."""
        versions: set[ApiVersion] = set()
        answer: Message = v1.VersionResponse()
        for version in CRI_VERSIONS:
            # Each version's step one PROBE_TIMEOUT, as when each asked Version
            # alone: v1alpha2's question its first half, Version the rest.
            budget = Budget.of(PROBE_TIMEOUT)
            if version is ApiVersion.V1ALPHA2 and ApiVersion.V1 in versions:
                there = await registered(self.runtime_channel, f"{version.package}.RuntimeService", budget.asking())
                if there is not None:
                    if there:
                        versions.add(version)
                    continue
            path = f"/{version.package}.RuntimeService/Version"
            try:
                raw = await self.runtime_channel.unary_unary(path)(b"", timeout=budget.left())
            except aio.AioRpcError as err:
                if err.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND):
                    continue
                # DEBUG: the failed probe has its own line ('backend not ready, retrying').
                self.runtime_failed(self.runtime_channel, err, logging.DEBUG)
                raise BackendUnavailable(f"{path}: {err.code().name}: {err.details()}") from err
            try:
                # Same field numbers in both versions: the v1 class reads either;
                # a string that is not UTF-8 is read as bytes (it only names the runtime).
                answer = lenient.parse(v1.VersionResponse, raw)
            except DecodeError as err:
                raise BackendUnavailable(f"{path}: answer is not a VersionResponse") from err
            versions.add(version)
        if not versions:
            known = ", ".join(CRI_VERSIONS)
            raise BackendUnavailable(f"{self.runtime_socket} answers no CRI version ({known})")
        await self._check_initialised(min(versions, key=CRI_VERSIONS.index))
        return BackendInfo(frozenset(versions), _text(answer, "runtime_name"), _text(answer, "runtime_version"))

    async def _check_initialised(self, version: ApiVersion) -> None:
        """Raise unless the runtime's CRI service is initialised, not only up.

        containerd's CRI plugin answers every CRI call, Version included,
        "server is not initialized yet" (UNKNOWN; UNAVAILABLE in 2.x) until it
        has loaded its state: that Version failure ends the probe above. A
        runtime whose Version answers before the rest does is caught here:
        Status is cheap (no listing) and held back as any call the runtime
        does not serve yet, so it tells when calls will be served. Its
        conditions are kubelet's to judge (a node without CNI yet is still
        served), so only the call's success counts here.
        """
        path = f"/{version.package}.RuntimeService/Status"
        try:
            await self.runtime_channel.unary_unary(path)(b"", timeout=PROBE_TIMEOUT)
        except aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:  # no such gate in this runtime
                return
            self.runtime_failed(self.runtime_channel, err, logging.DEBUG)  # as above
            raise BackendUnavailable(f"{path}: {err.code().name}: {err.details()}") from err

    def runtime_failed(self, channel: aio.Channel, err: aio.AioRpcError, level: int = logging.WARNING) -> None:
        """A call on ``channel`` failed with ``err``, a relayed call's or a
        probe's: containerd's 'not initialized yet' says its runtime does not
        serve (unready.py). ``level``: Unready's lines' (DEBUG for a probe,
        whose failure has its own line)."""
        if channel is self.runtime_channel and not_initialized(err.code().value[0], err.details() or ""):
            self.unready.saw(f"it answers {err.details()!r}", level)

    async def probe(self) -> BackendInfo:
        """Probe until the backend answers, with exponential backoff."""

        # As hook server outages are logged (outages.py): the outage's first
        # failed probe in full, then a summary at most once a minute, and one
        # line when the backend answers (_set). The outage is the Backend's,
        # not this call's: it starts when the backend is lost (or at the
        # first failed probe, at boot) and may end at a first probe.
        name = str(self.runtime_socket)

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            self._lost("probe failed", refuse=False)  # e.g. containerd came back with its CRI plugin broken
            self._outages.failed(
                name, logging.WARNING, "backend not ready, retrying", {"backend": name},
                detail={
                    "attempt": state.attempt_number,
                    "retry_in_s": round(state.next_action.sleep if state.next_action else 0, 2),
                },
                trailing={"error": str(exc)},
            )

        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(BackendUnavailable),
            wait=wait_exponential(multiplier=0.1, max=self._probe_max_interval),
            before_sleep=before_sleep,
            sleep=self._pause,
            reraise=True,
        ):
            with attempt:
                self._soon.clear()  # what comes from here on ends the wait after this probe, if it fails
                self._attempted = asyncio.get_running_loop().time()
                instance = runtime_instance(self.runtime_socket)  # before the answer: never newer than it
                info = await self.probe_once()
        self._instance = instance
        self._set(info)
        return info

    def _set(self, info: BackendInfo) -> None:
        # Listeners hear every successful probe, changed or not: after a
        # runtime restart the routing stays, but its state must be re-read.
        changed = info != self.info
        was_ready = self.info is not None
        self.info = info
        self.connected = True
        self.ready.set()
        self.unready.ready()  # its Status answered (probe_once)
        name = str(self.runtime_socket)
        self._outages.succeeded(name, {"backend": name}, first=not was_ready)
        (log.info if changed else log.debug)(
            "backend probed", extra={"backend": str(self.runtime_socket), "runtime": info.describe()}
        )
        for listener in self._listeners:
            self._tell(listener, "backend probed", info)

    async def run(self) -> None:
        """Probe, then check the runtime each time the channel comes back to READY.

        The channel is watched apart (``_watch``), so that what it does while a
        reconnect is being checked (a probe takes a while) is seen too."""
        await self.probe()
        changes: asyncio.Queue[grpc.ChannelConnectivity] = asyncio.Queue()
        watch = asyncio.create_task(self._watch(changes), name="backend-channel-watch")  # owned here
        change: asyncio.Task[grpc.ChannelConnectivity] | None = None
        try:
            while True:
                change = asyncio.ensure_future(changes.get())
                await asyncio.wait((change, watch), return_when=asyncio.FIRST_COMPLETED)
                if not change.done():  # the watch failed: so does the monitor (the supervisor restarts it)
                    watch.result()
                    raise RuntimeError("the channel watch ended")  # it never returns
                seen = [change.result()]
                while not changes.empty():  # what came while the last reconnect was checked: checked once
                    seen.append(changes.get_nowait())
                if grpc.ChannelConnectivity.TRANSIENT_FAILURE in seen:
                    self._lost("connection failed")
                if grpc.ChannelConnectivity.READY in seen:
                    await self._reconnected()
        finally:
            if change is not None:
                change.cancel()
            watch.cancel()
            await asyncio.wait([watch])  # ended; its failure, if any, was raised above

    async def _watch(self, changes: asyncio.Queue[grpc.ChannelConnectivity]) -> None:
        """Each state the channel is in after a change. READY after READY is
        a change too: a channel can leave READY and come back before this
        task looks (a call of the proxy's own, made meanwhile, reconnects it)."""
        state = self.runtime_channel.get_state(try_to_connect=True)
        while True:
            await self.runtime_channel.wait_for_state_change(state)
            state = self.runtime_channel.get_state(try_to_connect=True)
            changes.put_nowait(state)

    async def _reconnected(self) -> None:
        instance = runtime_instance(self.runtime_socket)
        if await self._same_runtime(instance):
            # grpc's client idle timeout closes an unused connection; the
            # monitor reconnects at once. Same runtime: nothing was lost.
            log.debug("backend connection re-established after idle", extra={"backend": str(self.runtime_socket)})
            self._notify_reconnect(False)
            return
        # A quick runtime restart reconnects without a failure state in
        # between: until probed again, the runtime is unknown.
        self._lost("reconnected, not probed yet")
        log.info("backend connection re-established, probing again", extra={"backend": str(self.runtime_socket)})
        try:
            await self.probe()
        except Exception:  # keep watching: the next reconnect probes again
            log.exception("re-probe failed", extra={"backend": str(self.runtime_socket)})
        self._notify_reconnect(True)

    async def _same_runtime(self, instance: RuntimeInstance | None) -> bool:
        """The channel went idle and reconnected to the runtime it left: still
        connected (no failure since), the same socket file (a restarted
        runtime creates a new one), and a quiet probe (health untouched)
        answers as before. When in doubt, it is a new runtime."""
        if not self.connected or instance is None or instance != self._instance:
            return False
        try:
            return await self.probe_once() == self.info
        except BackendUnavailable:
            # Its connection is up and unchanged: a Version slower than
            # PROBE_TIMEOUT does not say the runtime fails calls (refuse=False).
            self._lost("probe failed", refuse=False)
            self._outages.counted(str(self.runtime_socket))  # a failed probe of the outage as any other
            return False

    def _notify_reconnect(self, restarted: bool) -> None:
        for listener in self._reconnect_listeners:
            self._tell(listener, "backend reconnected", restarted)

    def _lost(self, reason: str, refuse: bool = True) -> None:
        """The backend is not known to answer (once per loss, until probed again).

        ``refuse``: its hooked calls are refused until it answers (unready.py),
        for a real loss: its connection failed, or a new runtime (a new
        socket) answers, which may listen before it serves (containerd's CRI
        plugin loading). A probe that failed on the connection it had is not
        one: an answer saying the runtime does not serve tells Unready itself
        (runtime_failed); a timeout or another error leaves its calls to the
        runtime (before: a Version slower than PROBE_TIMEOUT, after an idle
        reconnect, refused a working runtime's hooked calls)."""
        if not self.connected:
            return
        self.connected = False
        if refuse:
            self.unready.saw(f"it was lost ({reason}) and has not answered since", logging.DEBUG)
        # The outage starts at the loss: this line pairs with its end.
        name = str(self.runtime_socket)
        self._outages.began(name, logging.WARNING, "backend unavailable", {"backend": name, "reason": reason})
        for listener in self._lost_listeners:
            self._tell(listener, "backend unavailable")

    def _tell(self, listener: Callable[..., None], event: str, *args: object) -> None:
        """One listener's failure is its own: the others still hear the event,
        and the monitor (which keeps routing and health current) goes on."""
        try:
            listener(*args)
        except Exception:
            log.exception(
                "backend listener failed", extra={"backend": str(self.runtime_socket), "event": event, "listener": repr(listener)}
            )

    async def close(self) -> None:
        self.unready.close()
        await self.runtime_channel.close()
        if self.image_channel is not self.runtime_channel:
            await self.image_channel.close()
