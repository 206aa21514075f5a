"""A private, throw-away containerd for the CLI and the integration tests.

`LocalContainerd` runs `containerd` with its own root, state, sockets and runc
root under one base directory, so it never touches a system containerd and
everything it leaves behind can be cleaned up by `stop()`. Its images are
built from the host's static busybox (`images`) and imported with `ctr`
(`imageimport`), because no public registry is reachable.

The base directory has one owner at a time (`dirlock`): a second instance on
it fails at once and touches nothing, and `stop()` acts only on what this
instance's own successful `start()` set up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc

from . import unixsocket
from .containerdconf import ContainerdConfig, check_loopback
from .dirlock import DirectoryInUse, DirectoryLock
from .imageimport import CALL_TIMEOUT, POLL_INTERVAL, ImageImportFailed, import_test_images
from .process import (
    LOG_TAIL_LINES,
    HostProcessError,
    delete_runc_containers,
    dying_with_parent,
    log_end,
    mount_ids_under,
    run_command,
    shim_pids,
    tail,
    terminate_pids,
    terminate_process,
    unmount_new_under,
)

log = logging.getLogger(__name__)



class LocalRuntimeError(HostProcessError):
    """The private containerd could not be started or used."""


# containerd 1.7.13 (NRI v0.4.0) closes the socket pair of a plugin it starts
# from plugin_path twice (containerd/nri#66, fixed in containerd 1.7.14): the
# second close may hit a listener opened meanwhile. It then boots and refuses
# every connection, or exits on a bad file descriptor; about one start in a
# hundred here. Such a start is made once more.
_BOOTED = b"containerd successfully booted"


class _ListenerLost(LocalRuntimeError):
    """containerd lost one of its own listening sockets while starting (see _BOOTED)."""


async def overlayfs_works(directory: Path) -> bool:
    """Try an overlay mount in `directory`; containerd needs it on its root's filesystem."""
    probe = directory / "overlay-probe"
    dirs = {n: probe / n for n in ("lower", "upper", "work", "merged")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']}"
    try:
        rc, out = await run_command("mount", "-t", "overlay", "overlay", "-o", opts, str(dirs["merged"]))
        if rc == 0:
            await run_command("umount", str(dirs["merged"]))
        else:
            log.info("overlayfs unusable, using the native snapshotter", extra={"error": out.strip()})
        return rc == 0
    finally:
        shutil.rmtree(probe, ignore_errors=True)


@dataclass
class LocalContainerd:
    """A containerd whose whole state lives below `base` (a temporary directory)."""

    base: Path
    log_level: str = "info"
    snapshotter: str | None = None  # None: overlayfs if it works under base, else native
    # "127.0.0.1:<port>" registries that CRI PullImage reaches over plain HTTP.
    plain_http_registries: tuple[str, ...] = ()
    # Another containerd build (its bin/ holds containerd, its shim and ctr),
    # e.g. 1.7 for NRI; None: the one on PATH.
    bin_dir: Path | None = None
    # Serve NRI on `nri_socket` (containerd 1.7+; plugins may connect).
    nri: bool = False
    request_timeout: float = 2.0  # NRI plugin_request_timeout, seconds
    # containerd is sent SIGTERM when the thread that started it ends (setpriv
    # --pdeathsig): a proxy killed outright leaves no containerd serving on.
    # The CLI's choice; not for a loop in a worker thread, which ends first.
    die_with_parent: bool = False
    _proc: asyncio.subprocess.Process | None = field(default=None, init=False, repr=False)
    # What start-up is waiting for, told when it gives up (the log may not say).
    _waiting_for: str = field(default="", init=False, repr=False)
    _log_start: int = field(default=0, init=False, repr=False)  # where this start's log begins
    # Held from start() until stop() (or a failed start): base is ours alone meanwhile.
    _lock: DirectoryLock | None = field(default=None, init=False, repr=False)
    # start() succeeded and stop() has not run: only then has stop() anything of ours to stop.
    _started: bool = field(default=False, init=False, repr=False)
    # Mounts below base before containerd started (an operator's, another run's): never unmounted.
    _mounts_before: frozenset[int] = field(default=frozenset(), init=False, repr=False)

    def __post_init__(self) -> None:
        self.base = Path(self.base).resolve()
        for host in self.plain_http_registries:
            check_loopback(host)

    @property
    def socket(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def address(self) -> str:
        return unixsocket.grpc_target(self.socket)

    @property
    def config_path(self) -> Path:
        return self.base / "containerd.toml"

    @property
    def log_path(self) -> Path:
        return self.base / "containerd.log"

    @property
    def cni_conf_dir(self) -> Path:
        return self.base / "cni"

    @property
    def runc_root(self) -> Path:
        return self.base / "runc"

    @property
    def nri_socket(self) -> Path:
        return self.base / "nri.sock"

    def _tool(self, name: str) -> str:
        return str(self.bin_dir / name) if self.bin_dir is not None else name

    def _environment(self) -> dict[str, str] | None:
        if self.bin_dir is None:
            return None
        # containerd finds its shim on PATH: its own build's first.
        return {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"}

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    @property
    def started_pid(self) -> int | None:
        """The pid of the containerd start() started, also once it exited (``pid`` is None then)."""
        return self._proc.pid if self._proc is not None else None

    async def wait_exit(self) -> int:
        """Wait for the containerd start() started to exit; its returncode (-N: signal N)."""
        assert self._proc is not None, "not started"
        return await self._proc.wait()

    async def __aenter__(self) -> LocalContainerd:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- start ----------------------------------------------------------

    async def start(self, timeout: float = 30.0, *, images: bool = True) -> None:
        """Start containerd (again, after it died: the lock is still held then)."""
        if self.pid is not None:
            raise LocalRuntimeError("containerd is already running")
        try:  # containerd binds the socket and one more beside it: counted in bytes, as the kernel does
            unixsocket.check_path_length(Path(f"{self.socket}.ttrpc"))
        except unixsocket.PathTooLong:
            raise LocalRuntimeError(f"base directory path too long for a unix socket: {self.base}") from None
        if (problem := unixsocket.dial_problem(self.socket)) is not None:  # the proxy dials it
            raise LocalRuntimeError(f"cannot use {self.base} as containerd's directory: {problem}")
        try:
            self.base.mkdir(parents=True, exist_ok=True)
            self._take_base()  # before anything else reads or writes under base
        except OSError as exc:  # a file in the way, a read-only or foreign parent: the operator's to fix
            raise LocalRuntimeError(f"cannot use {self.base} as containerd's directory: {exc.strerror or exc}") from exc
        self._started = False
        try:
            self._check_socket_free()
            if self.snapshotter is None:
                self.snapshotter = "overlayfs" if await overlayfs_works(self.base) else "native"
            self.config_path.write_text(self._config())
            try:
                await self._start_once(timeout, images)
            except _ListenerLost as lost:
                log.warning("containerd lost a listening socket while starting NRI plugins (containerd/nri#66, "
                            "fixed in containerd 1.7.14); starting it again", extra={"error": str(lost)})
                await self._start_once(timeout, images)
        except BaseException:
            self._release_base()  # _start_once cleaned up what it started
            raise
        self._started = True
        log.info("containerd started", extra={"pid": self.pid, "address": self.address,
                                                "snapshotter": self.snapshotter})

    def _take_base(self) -> None:
        if self._lock is not None:  # a start after containerd died: base is still ours
            return
        try:
            self._lock = DirectoryLock.acquire(self.base)
        except DirectoryInUse as exc:
            raise LocalRuntimeError(str(exc)) from None
        self._mounts_before = frozenset(mount_ids_under(self.base))

    def _release_base(self) -> None:
        self._started = False
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _check_socket_free(self) -> None:
        """Refuse a socket someone serves: a containerd of a run that was killed
        (containerd runs in a session of its own and outlives it), or one started
        by hand. Start-up would take its answers for our containerd's."""
        if not self.socket.exists():
            return
        try:
            stale = unixsocket.is_stale(self.socket)
        except unixsocket.UnixSocketError as exc:
            raise LocalRuntimeError(str(exc)) from None
        if not stale:
            raise LocalRuntimeError(
                f"{self.socket} is served by a containerd this run did not start (left by a run that was "
                "killed?); stop it first, or choose another directory")

    async def _start_once(self, timeout: float, images: bool) -> None:
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as logfile:  # noqa: ASYNC230 - opening the local log for the child, once per start
            # A new session keeps a terminal's Ctrl-C away from containerd: stop() shuts it down.
            self._proc = await asyncio.create_subprocess_exec(
                *(dying_with_parent() if self.die_with_parent else ()), self._tool("containerd"),
                "--config", str(self.config_path),
                stdin=asyncio.subprocess.DEVNULL, stdout=logfile, stderr=logfile,
                start_new_session=True, env=self._environment())
        try:
            async with asyncio.timeout(timeout):
                await self._wait_ready()
                if images:
                    self._waiting_for = "the image imports"
                    await import_test_images(self._tool("ctr"), self.socket, self.snapshotter or "overlayfs",
                                             self.base / "images", timeout)
        except BaseException as exc:
            await self._shutdown(grace=5.0)
            if isinstance(exc, ImageImportFailed):
                raise LocalRuntimeError(str(exc)) from None
            if isinstance(exc, TimeoutError):
                raise LocalRuntimeError(
                    f"containerd not ready within {timeout}s (waiting for {self._waiting_for}); "
                    f"log tail:\n{self.log_tail()}") from None
            raise

    def _config(self) -> str:
        return ContainerdConfig(
            base=self.base, socket=self.socket, runc_root=self.runc_root, cni_conf_dir=self.cni_conf_dir,
            log_level=self.log_level, snapshotter=self.snapshotter or "overlayfs",
            plain_http_registries=self.plain_http_registries,
            nri_socket=self.nri_socket if self.nri else None, nri_request_timeout=self.request_timeout,
        ).toml()

    async def _wait_ready(self) -> None:
        """Poll CRI Version until it answers: containerd offers no readiness event."""
        assert self._proc is not None
        self._waiting_for = "its socket"
        exited = asyncio.ensure_future(self._proc.wait())
        try:
            while True:
                if await self._version_answers():
                    return
                # Sleep one interval, but wake at once if containerd dies.
                await asyncio.wait({exited}, timeout=POLL_INTERVAL)
                if exited.done():
                    if self.nri and b"bad file descriptor" in self._this_start_log():
                        raise _ListenerLost(f"containerd exited on a closed socket; log tail:\n{self.log_tail()}")
                    raise LocalRuntimeError(
                        f"containerd exited with status {exited.result()} during start-up; "
                        f"log tail:\n{self.log_tail()}")
        finally:
            exited.cancel()

    async def _version_answers(self) -> bool:
        if not self.socket.exists():
            return False
        # A subchannel of its own: one shared with the last try could answer with
        # that try's connection error (it waits out its backoff), not a new one.
        async with aio.insecure_channel(self.address, options=(("grpc.use_local_subchannel_pool", 1),)) as channel:
            try:
                await v1_grpc.RuntimeServiceStub(channel).Version(v1.VersionRequest(), timeout=1.0)
                return True
            except aio.AioRpcError as exc:
                self._waiting_for = f"CRI Version, last answered {exc.code().name}: {exc.details()}"
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    # containerd serves, but its CRI plugin failed to load: waiting will not help.
                    raise LocalRuntimeError(
                        f"containerd has no CRI service; log tail:\n{self.log_tail()}") from None
                details = (exc.details() or "").lower()
                refused = exc.code() == grpc.StatusCode.UNAVAILABLE and "connection refused" in details
                if self.nri and refused and _BOOTED in self._this_start_log():
                    # Refused after it said it serves: the listener is gone.
                    raise _ListenerLost(f"containerd booted, then refused connections on {self.socket}; "
                                        f"log tail:\n{self.log_tail()}") from None
                return False  # not listening yet, or the CRI plugin is still initialising

    def _this_start_log(self) -> bytes:
        """This start's log, its last _TAIL_BYTES at most (read at each refused poll)."""
        return log_end(self.log_path, self._log_start)[0]

    # ---- stop -----------------------------------------------------------

    async def stop(self, timeout: float = 30.0) -> None:
        """Remove all pods, stop containerd and clean up shims, containers and mounts.

        Best effort and idempotent: it also cleans up after a containerd that died.
        Only after this instance's own successful start: the socket, shims and
        mounts under base may otherwise belong to another run.
        """
        if not self._started:
            log.debug("containerd not started here: nothing to stop", extra={"base": str(self.base)})
            return
        try:
            if self.pid is not None:  # our own containerd answers on the socket
                try:
                    await asyncio.wait_for(self._remove_all_sandboxes(), timeout / 2)
                except Exception as exc:  # the rest of the clean-up must run regardless
                    log.warning("could not remove pod sandboxes", extra={"error": str(exc)})
            await self._shutdown(grace=max(timeout / 6, 1.0))
        finally:
            self._release_base()
        log.info("containerd stopped", extra={"base": str(self.base)})

    async def _remove_all_sandboxes(self) -> None:
        async with aio.insecure_channel(self.address) as channel:
            stub = v1_grpc.RuntimeServiceStub(channel)
            listed = await stub.ListPodSandbox(v1.ListPodSandboxRequest(), timeout=CALL_TIMEOUT)
            for sandbox in listed.items:
                # RemovePodSandbox also removes the sandbox's containers.
                for call, req in ((stub.StopPodSandbox, v1.StopPodSandboxRequest),
                                  (stub.RemovePodSandbox, v1.RemovePodSandboxRequest)):
                    try:
                        await call(req(pod_sandbox_id=sandbox.id), timeout=CALL_TIMEOUT * 2)
                    except aio.AioRpcError as exc:
                        if exc.code() != grpc.StatusCode.NOT_FOUND:
                            log.warning("sandbox cleanup failed",
                                        extra={"sandbox": sandbox.id, "error": exc.details()})

    async def _shutdown(self, grace: float) -> None:
        steps: tuple[tuple[str, Callable[[], Awaitable[None]]], ...] = (
            ("stop containerd", lambda: self._terminate(grace)),
            # Containers whose shim outlived containerd, so they do not leak.
            ("delete runc containers", lambda: delete_runc_containers(self.runc_root)),
            ("stop shims", lambda: terminate_pids(shim_pids(self.socket), grace)),
            # What containerd mounted below its own directories since it started.
            ("unmount", lambda: unmount_new_under(
                self.base, (self.base / "root", self.base / "state", self.runc_root), self._mounts_before)),
        )
        for name, step in steps:
            try:
                await step()
            except Exception as exc:  # (runc missing or hung, say) the later steps still clean up
                log.warning("local containerd clean-up step failed; going on with the rest",
                            extra={"step": name, "error": str(exc) or type(exc).__name__})

    async def _terminate(self, grace: float) -> None:
        if self._proc is not None:
            await terminate_process(self._proc, grace, "containerd")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """This start's last lines (not an earlier run's, on the same directory)."""
        return tail(self.log_path, lines, since=self._log_start)
