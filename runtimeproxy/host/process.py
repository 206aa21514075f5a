"""Host process helpers: running a command, ending processes, what a containerd leaves behind.

`terminate_process` is the one way the project ends a child process (SIGTERM,
then SIGKILL after a grace period); `terminate_pids` does the same for
processes that are not our children (containerd shims).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
from pathlib import Path

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
_TAIL_BYTES = 64 * 1024  # what ``tail`` reads: 40 lines of containerd's log fit many times over
_SHIM_PREFIX = b"containerd-shim"


class HostProcessError(RuntimeError):
    """A host process failed, timed out or did not come up."""


async def run_command(*argv: str, timeout: float = 30.0) -> tuple[int, str]:
    """Run a command, returning (exit code, combined output)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise HostProcessError(f"{argv[0]} timed out after {timeout}s: {' '.join(argv)}") from None
    return proc.returncode or 0, out.decode(errors="replace")


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


async def terminate_pids(pids: list[int], grace: float) -> None:
    """`terminate_process` for processes that are not our children, all at once."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        gone = await asyncio.gather(*(_wait_pid_gone(p, grace) for p in pids))
        pids = [p for p, ok in zip(pids, gone, strict=True) if not ok]
        if not pids:
            return
    log.warning("processes survived SIGKILL", extra={"pids": pids})


def _decode_mount_field(value: str) -> str:
    # /proc/self/mountinfo (as /proc/self/mounts) escapes space, tab, newline and backslash as octal.
    for esc, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        value = value.replace(esc, ch)
    return value


def _mounts() -> list[tuple[int, Path]]:
    """Every mount of this process's namespace, (mount id, mount point), in mount order."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5:
            found.append((int(fields[0]), Path(_decode_mount_field(fields[4]))))
    return found


def mounts_under(base: Path) -> list[Path]:
    """Mount points at or below `base`, in mount order."""
    base = base.resolve()
    return [target for _, target in _mounts() if target == base or base in target.parents]


def mount_ids_under(base: Path) -> dict[int, Path]:
    """Mounts strictly below `base`, by mount id, in mount order."""
    base = base.resolve()
    return {mount_id: target for mount_id, target in _mounts() if base in target.parents}


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


def log_end(path: Path, since: int = 0) -> tuple[bytes, bool]:
    """The end of a process's log file from byte ``since`` on (where this
    run's lines begin: containerd.log is appended to by every run on its
    directory, never rotated), at most its last ``_TAIL_BYTES``, and whether
    the first line in them is cut (begins before them), told by the byte
    before them; ``since`` past the end (the file cut meanwhile) reads from
    its start. Raises OSError."""
    with open(path, "rb") as logfile:
        end = logfile.seek(0, os.SEEK_END)
        since = since if since <= end else 0
        start = max(end - _TAIL_BYTES - 1, since)
        logfile.seek(start)
        data = logfile.read(end - start)  # no further: the log may grow as it is read
    if start == since:
        return data, False
    return data[1:], data[:1] != b"\n"  # the byte before the last _TAIL_BYTES: a line's end, or part of the cut line


def tail(path: Path, lines: int = LOG_TAIL_LINES, since: int = 0) -> str:
    """The last lines of a process's log file from byte ``since`` on, for
    error messages, read by :func:`log_end`. A cut first line is left out,
    unless it is all there is (one line longer than what is read): it comes
    marked with a leading "…" then."""
    try:
        data, cut = log_end(path, since)
    except OSError:
        return f"({path} not readable)"
    kept = data.decode(errors="replace").splitlines()
    if cut and len(kept) > 1:
        kept = kept[1:]  # it began before the bytes read
    elif cut and kept:
        kept = ["…" + kept[0]]
    return "\n".join(kept[-lines:])


def exit_status(returncode: int) -> str:
    """How a process ended, from asyncio's returncode (-N: killed by signal N)."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def dying_with_parent() -> tuple[str, ...]:
    """A command prefix: the command gets SIGTERM when the thread that started
    it ends (setpriv --pdeathsig; util-linux, on every Debian), () without setpriv."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        log.warning("setpriv not found: a child process outlives a parent killed outright")
        return ()
    return (setpriv, "--pdeathsig", "TERM")


async def delete_runc_containers(runc_root: Path) -> None:
    """runc's containers under each namespace root of ``runc_root``, killed and deleted."""
    if not runc_root.is_dir():  # noqa: ASYNC240 - runc's state dir (tmpfs), in a clean-up after the runtime stopped
        return
    for ns_root in runc_root.iterdir():  # noqa: ASYNC240 - see above
        rc, out = await run_command("runc", "--root", str(ns_root), "list", "-q")
        for cid in out.split() if rc == 0 else ():
            rc, out = await run_command("runc", "--root", str(ns_root), "delete", "--force", cid)
            if rc != 0:
                log.warning("runc delete failed", extra={"id": cid, "error": out.strip()})


async def unmount_new_under(base: Path, own: tuple[Path, ...], before: frozenset[int]) -> None:
    """Unmount what is mounted at or below one of ``own`` (inside ``base``)
    and was not mounted before (mount ids ``before``): base itself, an
    operator's mount below it, or another run's nested in it, is left alone."""
    mounts = mount_ids_under(base)
    ours = [target for mount_id, target in mounts.items() if mount_id not in before
            and any(target == top or top in target.parents for top in own)]
    # Innermost first; lazy so a busy mount cannot block removing the directory.
    for target in reversed(ours):
        rc, out = await run_command("umount", "-l", str(target))
        if rc != 0:
            log.warning("umount failed", extra={"target": str(target), "error": out.strip()})

