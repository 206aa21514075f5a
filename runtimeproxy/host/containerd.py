"""A private, throw-away containerd for the CLI and the integration tests.

`LocalContainerd` runs `containerd` with its own root, state, sockets and runc
root under one base directory, so it never touches a system containerd and
everything it leaves behind can be cleaned up by `stop()`. Images are built
from the host's static busybox in pure Python and imported with `ctr`,
because no public registry is reachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import io
import json
import logging
import os
import platform
import shutil
import signal
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc

log = logging.getLogger(__name__)

K8S_NAMESPACE = "k8s.io"  # the containerd namespace of the CRI plugin
BUSYBOX_IMAGE = "localhost/runtime-proxy/busybox:1.0"
PAUSE_IMAGE = "localhost/runtime-proxy/pause:1.0"
BUSYBOX_BINARY = Path("/bin/busybox")
# Repository and tag of the busybox image in a LoopbackRegistry (its ref adds 127.0.0.1:<port>/).
REGISTRY_BUSYBOX_REPO = "runtime-proxy/busybox:1.0"

_SHIM_PREFIX = b"containerd-shim"
_CNI_BIN_DIR = Path("/usr/lib/cni")
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the NUL
_CALL_TIMEOUT = 5.0
_POLL_INTERVAL = 0.05
_LOG_TAIL_LINES = 40


class LocalRuntimeError(RuntimeError):
    pass


# --------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------

_APPLETS = (
    "sh", "ash", "sleep", "env", "cat", "echo", "ls", "true", "false", "ps",
    "id", "kill", "mkdir", "rm", "rmdir", "touch", "cp", "mv", "ln", "grep",
    "head", "tail", "wc", "date", "hostname", "printf", "test", "[", "sed",
    "awk", "tr", "cut", "sort", "uniq", "stat", "readlink", "find", "xargs",
    "dd", "mount", "df", "du", "free", "uname", "whoami", "nproc", "pwd",
    "chmod", "chown", "top", "sync", "yes", "seq", "timeout", "nc", "wget",
)
_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# PID 1 ignores signals it has no handler for, so the pause process traps
# them; the backgrounded sleep keeps the shell able to run the trap at once.
_PAUSE_SCRIPT = "trap 'exit 0' TERM INT; while :; do sleep 2147483647 & wait $!; done"

_MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_MT_INDEX = "application/vnd.oci.image.index.v1+json"
_MT_CONFIG = "application/vnd.oci.image.config.v1+json"
_MT_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
_EPOCH = "1970-01-01T00:00:00Z"


@dataclass(frozen=True)
class BusyboxImage:
    """An image made of the host's static busybox; only its ref and command differ."""

    ref: str
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()


TEST_IMAGES = (
    BusyboxImage(BUSYBOX_IMAGE, cmd=("sh",)),
    BusyboxImage(PAUSE_IMAGE, entrypoint=("/bin/sh", "-c", _PAUSE_SCRIPT)),
)


def _oci_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(machine, machine)


def _tar_add(tar: tarfile.TarFile, name: str, *, data: bytes | None = None,
             mode: int = 0o755, linkname: str | None = None) -> None:
    # Fixed owners and mtimes keep the layer digest reproducible.
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.mtime = 0
    if linkname is not None:
        info.type = tarfile.SYMTYPE
        info.linkname = linkname
        tar.addfile(info)
    elif data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _busybox_layer(busybox: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "etc", "proc", "root", "sys", "usr", "usr/bin", "var"):
            _tar_add(tar, d)
        _tar_add(tar, "tmp", mode=0o1777)
        _tar_add(tar, "bin/busybox", data=busybox.read_bytes())
        for applet in _APPLETS:
            _tar_add(tar, f"bin/{applet}", linkname="busybox")
        _tar_add(tar, "etc/passwd", mode=0o644, data=(
            b"root:x:0:0:root:/root:/bin/sh\n"
            b"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"))
        _tar_add(tar, "etc/group", mode=0o644, data=b"root:x:0:\nnobody:x:65534:\n")
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build_image_archive(dest: Path, image: BusyboxImage, *, busybox: Path = BUSYBOX_BINARY) -> Path:
    """Write an OCI image-layout tar archive holding one busybox image."""
    layer = _busybox_layer(busybox)
    blobs: dict[str, bytes] = {}
    layer_desc = _blob(blobs, gzip.compress(layer, mtime=0), _MT_LAYER_GZIP)
    # The ref label gives every image its own config, hence its own image id in CRI.
    config: dict[str, object] = {"Env": [_PATH_ENV], "WorkingDir": "/",
                                 "Labels": {"org.opencontainers.image.ref.name": image.ref}}
    if image.entrypoint:
        config["Entrypoint"] = list(image.entrypoint)
    if image.cmd:
        config["Cmd"] = list(image.cmd)
    config_desc = _blob(blobs, _json({
        "created": _EPOCH,
        "architecture": _oci_arch(),
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        "history": [{"created": _EPOCH, "created_by": "runtimeproxy.host.containerd"}],
    }), _MT_CONFIG)
    manifest_desc = _blob(blobs, _json({
        "schemaVersion": 2, "mediaType": _MT_MANIFEST, "config": config_desc, "layers": [layer_desc],
    }), _MT_MANIFEST)
    manifest_desc["annotations"] = {"org.opencontainers.image.ref.name": image.ref}
    index = {"schemaVersion": 2, "mediaType": _MT_INDEX, "manifests": [manifest_desc]}

    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_add(tar, "oci-layout", mode=0o644, data=_json({"imageLayoutVersion": "1.0.0"}))
        _tar_add(tar, "index.json", mode=0o644, data=_json(index))
        _tar_add(tar, "blobs")
        _tar_add(tar, "blobs/sha256")
        for digest, data in blobs.items():
            _tar_add(tar, f"blobs/sha256/{digest.removeprefix('sha256:')}", mode=0o644, data=data)
    return dest


def build_test_images(directory: Path, *, busybox: Path = BUSYBOX_BINARY) -> dict[str, Path]:
    """Build the busybox and pause archives; returns image ref -> archive path."""
    return {
        image.ref: build_image_archive(directory / f"{image.ref.rsplit('/', 1)[-1].replace(':', '-')}.tar",
                                       image, busybox=busybox)
        for image in TEST_IMAGES
    }


# --------------------------------------------------------------------------
# Host helpers
# --------------------------------------------------------------------------


async def _run(*argv: str, timeout: float = 30.0) -> tuple[int, str]:
    """Run a command, returning (exit code, combined output)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise LocalRuntimeError(f"{argv[0]} timed out after {timeout}s: {' '.join(argv)}") from None
    return proc.returncode or 0, out.decode(errors="replace")


def _decode_mount_field(value: str) -> str:
    # /proc/self/mounts escapes space, tab, newline and backslash as octal.
    for esc, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        value = value.replace(esc, ch)
    return value


def mounts_under(base: Path) -> list[Path]:
    """Mount points at or below `base`, in mount order."""
    base = base.resolve()
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        target = Path(_decode_mount_field(fields[1]))
        if target == base or base in target.parents:
            found.append(target)
    return found


def shim_pids(socket: Path) -> list[int]:
    """PIDs of containerd shims started by the containerd listening on `socket`.

    Shims get `-address <socket>` on their command line, which tells instances apart.
    """
    wanted = os.fsencode(socket)
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # the process exited while we looked
        if os.path.basename(argv[0]).startswith(_SHIM_PREFIX) and wanted in argv[1:]:
            pids.append(int(entry.name))
    return pids


async def _wait_pid_gone(pid: int, timeout: float) -> bool:
    """Wait for a process that is not our child to exit (pidfd is readable then)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(fd, on_exit)
    try:
        await asyncio.wait_for(exited, timeout)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def _terminate_pids(pids: list[int], grace: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        gone = await asyncio.gather(*(_wait_pid_gone(p, grace) for p in pids))
        pids = [p for p, ok in zip(pids, gone, strict=True) if not ok]
        if not pids:
            return
    log.warning("processes survived SIGKILL", extra={"pids": pids})


async def overlayfs_works(directory: Path) -> bool:
    """Try an overlay mount in `directory`; containerd needs it on its root's filesystem."""
    probe = directory / "overlay-probe"
    dirs = {n: probe / n for n in ("lower", "upper", "work", "merged")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']}"
    try:
        rc, out = await _run("mount", "-t", "overlay", "overlay", "-o", opts, str(dirs["merged"]))
        if rc == 0:
            await _run("umount", str(dirs["merged"]))
        else:
            log.info("overlayfs unusable, using the native snapshotter", extra={"error": out.strip()})
        return rc == 0
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _toml_str(value: str) -> str:
    return json.dumps(value)  # JSON string escapes are valid TOML basic strings


def _check_loopback(host: str) -> None:
    """Registries here are private test fixtures: only ever talk to one on the loopback."""
    address, _, port = host.rpartition(":")
    if address != "127.0.0.1" or not port.isdigit():
        raise ValueError(f"not a 127.0.0.1:<port> registry: {host!r}")


# --------------------------------------------------------------------------
# containerd
# --------------------------------------------------------------------------

_DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.internal.v1.tracing",
    "io.containerd.tracing.processor.v1.otlp",
)


async def terminate_process(proc: asyncio.subprocess.Process, grace: float, name: str) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; returns once it exited."""
    if proc.returncode is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            await asyncio.wait_for(proc.wait(), grace)
            return
        except TimeoutError:
            log.warning("process ignored signal", extra={"proc": name, "signal": sig.name})


@dataclass
class LocalContainerd:
    """A containerd whose whole state lives below `base` (a temporary directory)."""

    base: Path
    log_level: str = "info"
    snapshotter: str | None = None  # None: overlayfs if it works under base, else native
    # "127.0.0.1:<port>" registries that CRI PullImage reaches over plain HTTP.
    plain_http_registries: tuple[str, ...] = ()
    _proc: asyncio.subprocess.Process | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.base = Path(self.base).resolve()
        for host in self.plain_http_registries:
            _check_loopback(host)

    @property
    def socket(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def address(self) -> str:
        return f"unix://{self.socket}"

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
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def __aenter__(self) -> LocalContainerd:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- start ----------------------------------------------------------

    async def start(self, timeout: float = 30.0, *, images: bool = True) -> None:
        if self.pid is not None:
            raise LocalRuntimeError("containerd is already running")
        if len(str(self.socket)) + len(".ttrpc") > _SOCKET_PATH_MAX:
            raise LocalRuntimeError(f"base directory path too long for a unix socket: {self.base}")
        self.base.mkdir(parents=True, exist_ok=True)
        if self.snapshotter is None:
            self.snapshotter = "overlayfs" if await overlayfs_works(self.base) else "native"
        self.config_path.write_text(self._config())
        with open(self.log_path, "ab") as logfile:
            # A new session keeps a terminal's Ctrl-C away from containerd: stop() shuts it down.
            self._proc = await asyncio.create_subprocess_exec(
                "containerd", "--config", str(self.config_path),
                stdin=asyncio.subprocess.DEVNULL, stdout=logfile, stderr=logfile,
                start_new_session=True)
        try:
            async with asyncio.timeout(timeout):
                await self._wait_ready()
                if images:
                    await self.import_images()
        except BaseException as exc:
            await self._shutdown(grace=5.0)
            if isinstance(exc, TimeoutError):
                raise LocalRuntimeError(
                    f"containerd not ready within {timeout}s; log tail:\n{self.log_tail()}") from None
            raise
        log.info("containerd started", extra={"pid": self._proc.pid, "address": self.address,
                                                "snapshotter": self.snapshotter})

    def _config(self) -> str:
        b = self.base
        q = _toml_str
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        return "\n".join([
            "version = 2",
            f"root = {q(str(b / 'root'))}",
            f"state = {q(str(b / 'state'))}",
            "oom_score = 0",
            "disabled_plugins = [" + ", ".join(q(p) for p in _DISABLED_PLUGINS) + "]",
            "",
            "[grpc]",
            f"  address = {q(str(self.socket))}",
            "[ttrpc]",
            f"  address = {q(str(self.socket) + '.ttrpc')}",
            "[debug]",
            '  address = ""',  # no debug socket: nothing reads it
            f"  level = {q(self.log_level)}",
            "[metrics]",
            '  address = ""',
            "",
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {q(str(b / 'opt'))}",
            f"{cri}]",
            f"  sandbox_image = {q(PAUSE_IMAGE)}",
            # The VM forbids lowering oom_score_adj below our own; runc fails otherwise.
            "  restrict_oom_score_adj = true",
            "  disable_apparmor = true",
            "  disable_tcp_service = true",
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            # Should a pod get a netns anyway, its bind mount is below base, where stop() unmounts.
            "  netns_mounts_under_state_dir = true",
            f"{cri}.containerd]",
            f"  snapshotter = {q(self.snapshotter or 'overlayfs')}",
            '  default_runtime_name = "runc"',
            f"{cri}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"{cri}.containerd.runtimes.runc.options]",
            f"  Root = {q(str(self.runc_root))}",
            "  SystemdCgroup = false",
            # Pods must use the host network: no CNI config, and the host's is kept out.
            f"{cri}.cni]",
            f"  bin_dir = {q(str(_CNI_BIN_DIR))}",
            f"  conf_dir = {q(str(self.cni_conf_dir))}",
            f"{cri}.registry]",
            '  config_path = ""',
            *(line for host in self.plain_http_registries for line in (
                f"{cri}.registry.mirrors.{q(host)}]",
                f"  endpoint = [{q('http://' + host)}]",
            )),
            "",
        ])

    async def _wait_ready(self) -> None:
        """Poll CRI Version until it answers: containerd offers no readiness event."""
        assert self._proc is not None
        exited = asyncio.ensure_future(self._proc.wait())
        try:
            while True:
                if await self._version_answers():
                    return
                # Sleep one interval, but wake at once if containerd dies.
                await asyncio.wait({exited}, timeout=_POLL_INTERVAL)
                if exited.done():
                    raise LocalRuntimeError(
                        f"containerd exited with status {exited.result()} during start-up; "
                        f"log tail:\n{self.log_tail()}")
        finally:
            exited.cancel()

    async def _version_answers(self) -> bool:
        if not self.socket.exists():
            return False
        async with aio.insecure_channel(self.address) as channel:
            try:
                await v1_grpc.RuntimeServiceStub(channel).Version(v1.VersionRequest(), timeout=1.0)
                return True
            except aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    # containerd serves, but its CRI plugin failed to load: waiting will not help.
                    raise LocalRuntimeError(
                        f"containerd has no CRI service; log tail:\n{self.log_tail()}") from None
                return False  # not listening yet, or the CRI plugin is still initialising

    # ---- images ---------------------------------------------------------

    async def import_images(self, timeout: float = 30.0) -> None:
        """Import the busybox and pause images into the CRI namespace.

        Waits until the CRI plugin lists them: it learns about imports from
        containerd events, so ctr returning is not enough.
        """
        archives = build_test_images(self.base / "images")
        async with asyncio.timeout(timeout):
            for ref, archive in archives.items():
                rc, out = await _run(
                    "ctr", "--address", str(self.socket), "-n", K8S_NAMESPACE, "images", "import",
                    "--base-name", ref.rsplit(":", 1)[0], "--snapshotter", self.snapshotter or "overlayfs",
                    str(archive), timeout=timeout)
                if rc != 0:
                    raise LocalRuntimeError(f"ctr images import {archive} failed: {out.strip()}")
            async with aio.insecure_channel(self.address) as channel:
                stub = v1_grpc.ImageServiceStub(channel)
                for ref in archives:
                    # Bounded by the timeout above; CRI offers no event for images appearing.
                    while not (await stub.ImageStatus(
                            v1.ImageStatusRequest(image=v1.ImageSpec(image=ref)),
                            timeout=_CALL_TIMEOUT)).HasField("image"):
                        await asyncio.sleep(_POLL_INTERVAL)
        log.info("images imported", extra={"images": sorted(archives)})

    # ---- stop -----------------------------------------------------------

    async def stop(self, timeout: float = 30.0) -> None:
        """Remove all pods, stop containerd and clean up shims, containers and mounts.

        Best effort and idempotent: it also cleans up after a containerd that died.
        """
        if self.pid is not None:
            try:
                await asyncio.wait_for(self._remove_all_sandboxes(), timeout / 2)
            except Exception as exc:  # the rest of the clean-up must run regardless
                log.warning("could not remove pod sandboxes", extra={"error": str(exc)})
        await self._shutdown(grace=max(timeout / 6, 1.0))
        log.info("containerd stopped", extra={"base": str(self.base)})

    async def _remove_all_sandboxes(self) -> None:
        async with aio.insecure_channel(self.address) as channel:
            stub = v1_grpc.RuntimeServiceStub(channel)
            listed = await stub.ListPodSandbox(v1.ListPodSandboxRequest(), timeout=_CALL_TIMEOUT)
            for sandbox in listed.items:
                # RemovePodSandbox also removes the sandbox's containers.
                for call, req in ((stub.StopPodSandbox, v1.StopPodSandboxRequest),
                                  (stub.RemovePodSandbox, v1.RemovePodSandboxRequest)):
                    try:
                        await call(req(pod_sandbox_id=sandbox.id), timeout=_CALL_TIMEOUT * 2)
                    except aio.AioRpcError as exc:
                        if exc.code() != grpc.StatusCode.NOT_FOUND:
                            log.warning("sandbox cleanup failed",
                                        extra={"sandbox": sandbox.id, "error": exc.details()})

    async def _shutdown(self, grace: float) -> None:
        await self._terminate(grace)
        await self._delete_runc_containers()
        await _terminate_pids(shim_pids(self.socket), grace)
        await self._unmount_all()

    async def _terminate(self, grace: float) -> None:
        if self._proc is not None:
            await terminate_process(self._proc, grace, "containerd")

    async def _delete_runc_containers(self) -> None:
        """Kill containers whose shim outlived containerd, so they do not leak."""
        if not self.runc_root.is_dir():
            return
        for ns_root in self.runc_root.iterdir():
            rc, out = await _run("runc", "--root", str(ns_root), "list", "-q")
            for cid in out.split() if rc == 0 else ():
                rc, out = await _run("runc", "--root", str(ns_root), "delete", "--force", cid)
                if rc != 0:
                    log.warning("runc delete failed", extra={"id": cid, "error": out.strip()})

    async def _unmount_all(self) -> None:
        # Innermost first; lazy so a busy mount cannot block removing the directory.
        for target in reversed(mounts_under(self.base)):
            rc, out = await _run("umount", "-l", str(target))
            if rc != 0:
                log.warning("umount failed", extra={"target": str(target), "error": out.strip()})

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        return _tail(self.log_path, lines)


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} not readable)"


# --------------------------------------------------------------------------
# A registry on the loopback, for a real PullImage path
# --------------------------------------------------------------------------


@dataclass
class LoopbackRegistry:
    """Debian's `docker-registry` on 127.0.0.1:<free port>, storing below `base`."""

    base: Path
    _proc: asyncio.subprocess.Process | None = field(default=None, init=False, repr=False)
    _pump: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _port: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.base = Path(self.base).resolve()

    @property
    def host(self) -> str:
        """"127.0.0.1:<port>", the registry part of image refs."""
        if self._port is None:
            raise LocalRuntimeError("registry not started")
        return f"127.0.0.1:{self._port}"

    @property
    def log_path(self) -> Path:
        return self.base / "registry.log"

    def ref(self, repo_tag: str = REGISTRY_BUSYBOX_REPO) -> str:
        return f"{self.host}/{repo_tag}"

    async def __aenter__(self) -> LoopbackRegistry:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, timeout: float = 30.0) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        config = self.base / "registry.yml"
        # JSON is YAML. Port 0: the kernel picks a free port, and the registry logs it.
        config.write_text(json.dumps({
            "version": 0.1,
            "log": {"level": "info"},
            "storage": {"filesystem": {"rootdirectory": str(self.base / "storage")},
                        "maintenance": {"uploadpurging": {"enabled": False}}},
            "http": {"addr": "127.0.0.1:0", "secret": os.urandom(16).hex()},
        }))
        self._proc = await asyncio.create_subprocess_exec(
            "docker-registry", "serve", str(config), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        listening: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pump = asyncio.create_task(self._pump_log(listening))
        try:
            self._port = await asyncio.wait_for(listening, timeout)
        except BaseException:
            await self.stop()
            raise
        log.info("registry started", extra={"pid": self._proc.pid, "host": self.host})

    async def _pump_log(self, listening: asyncio.Future[int]) -> None:
        """Copy the registry's stderr to its log; resolve `listening` with the port it reports."""
        assert self._proc is not None and self._proc.stderr is not None
        with open(self.log_path, "ab") as logfile:
            async for line in self._proc.stderr:
                logfile.write(line)
                logfile.flush()
                if not listening.done() and b'msg="listening on 127.0.0.1:' in line:
                    port = line.split(b'msg="listening on 127.0.0.1:', 1)[1].split(b'"', 1)[0]
                    listening.set_result(int(port))
        if not listening.done():
            listening.set_exception(LocalRuntimeError(
                f"docker-registry exited during start-up; log tail:\n{_tail(self.log_path)}"))

    async def push(self, archive: Path, repo_tag: str = REGISTRY_BUSYBOX_REPO, timeout: float = 60.0) -> str:
        """Copy the single image in an OCI archive to repo_tag; returns its full ref."""
        ref = self.ref(repo_tag)
        rc, out = await _run(
            "skopeo", "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false",
            f"oci-archive:{archive}", f"docker://{ref}", timeout=timeout)
        if rc != 0:
            raise LocalRuntimeError(f"skopeo copy to {ref} failed: {out.strip()}")
        return ref

    async def push_busybox(self, repo_tag: str = REGISTRY_BUSYBOX_REPO) -> str:
        """Push a busybox image (cmd `sh`) as repo_tag; returns its ref in this registry.

        Its image id differs from BUSYBOX_IMAGE's, so removing one leaves the other.
        """
        ref = self.ref(repo_tag)
        archive = build_image_archive(self.base / "images" / "busybox-push.tar", BusyboxImage(ref, cmd=("sh",)))
        return await self.push(archive, repo_tag)

    async def stop(self, grace: float = 5.0) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), grace)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._pump is not None:
            await asyncio.gather(self._pump, return_exceptions=True)  # ends at EOF
        log.info("registry stopped", extra={"base": str(self.base)})
