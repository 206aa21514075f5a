"""``check-config``'s look at a hook directory: the registry ``serve`` runs,
reloaded once (its directory rules, file selection and per-file checks),
then every problem of each file it rejects, and what is valid but likely a
slip: a file that registers nothing, a hook point never called, a key in
another case or nothing reads, a hook server's socket not there, balloons
called before a hook that sets the CPU shares it sizes by, a hook server
whose socket, or the user listening on it, the proxy would refuse
(untrusted_endpoint). Those are judged by the proxy's rules
(hookclient/endpointtrust.py) as the user check-config runs as: the proxy's
own euid is trusted there, so run it as the proxy runs (root)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
from collections.abc import Iterable
from pathlib import Path

from .checkfindings import Finding, Severity, endpoint_findings
from .hookclient.endpointtrust import Peer, judge, judge_peer, look, peer_of
from .hookpath.executor import HOOKED_METHODS
from .hookpath.filesafety import read_hook_file
from .hookpath.hookdir import DirectoryState, inspect_directory
from .hookpath.hookfile import KNOWN_KEYS, HookConfigError, HookServerConfig, parse_hook_file
from .hookpath.hookkeys import match_keys, object_pairs
from .hookpath.points import HOOK_POINTS, HookType
from .hookpath.registry import HookRegistry
from .shown import shown

__all__ = ["check_hook_directory"]


def check_hook_directory(directory: Path) -> tuple[tuple[HookServerConfig, ...], list[Finding]]:
    """The hook servers ``serve`` would load from ``directory``, and the findings."""
    result = HookRegistry(directory).reload()
    findings: list[Finding] = []
    if result.directory_error is not None:
        # A missing directory is normal before the first hook server registers;
        # a file in its place, or in its path, is not (serve keeps the hooks it had).
        gone = inspect_directory(directory, check_permissions=False).state is DirectoryState.GONE
        severity = Severity.WARNING if gone else Severity.ERROR
        findings.append(Finding(severity, directory, result.directory_error))
    for name, reason in sorted(result.rejected.items()):
        path = directory / name
        findings += [Finding(Severity.ERROR, path, problem) for problem in _problems(path, reason)]
        findings += _key_findings(path)
    servers = tuple(result.snapshot.servers.values())
    for server in servers:
        findings += _suspicious(directory / server.name, server)
    findings += _balloons_order(directory, servers)
    return servers, findings


def _problems(path: Path, reason: str) -> tuple[str, ...]:
    """Every problem of a file the registry rejected for ``reason`` (which
    names them all in one line): each on its own, and for a file refused for
    its own owner or mode, what its content is refused for too, so that one
    pass fixes it. ``reason`` alone if the file reads well now (changed since)."""
    try:
        parse_hook_file(path)
    except HookConfigError as exc:
        problems = list(exc.problems)
        if exc.unsafe and _refused_itself(path):
            try:  # its content, read as if it were safe: never through a symlink
                parse_hook_file(path, check_permissions=False, follow_symlinks=False)
            except HookConfigError as content:
                if not content.transient:  # (replaced by a symlink meanwhile, say)
                    problems += [problem for problem in content.problems if problem not in problems]
        return tuple(problems)
    return (reason,)


def _refused_itself(path: Path) -> bool:
    """Whether a hook file refused as unsafe is refused for its own owner or
    mode: not a symlink, whose target may be any file of the node (root's
    check-config must not show what is in it), in a directory anyone may write."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _content(path: Path) -> bytes | None:
    """What check-config judges of a hook file: its content as serve reads it,
    or as it is for a file refused for its own owner or mode; None if neither."""
    try:
        return read_hook_file(path, check_permissions=True)[0]  # safely: no FIFO, no huge file
    except HookConfigError as exc:
        if not exc.unsafe or not _refused_itself(path):
            return None
    try:
        return read_hook_file(path, check_permissions=False, follow_symlinks=False)[0]
    except HookConfigError:
        return None


def _key_findings(path: Path) -> Iterable[Finding]:
    """A known key in another case or given twice (read as koord-runtime-proxy
    reads it: hookkeys.py), a key of ours in another case (ignored), and keys
    nothing reads, of any hook file that is a JSON object, valid or not."""
    data = _content(path)
    if data is None:
        return
    try:
        doc = json.loads(data.decode("utf-8-sig"), object_pairs_hook=object_pairs)
    except (ValueError, RecursionError):  # its error is among the file's problems
        return
    if not isinstance(doc, dict):
        return
    keyed = match_keys(doc, KNOWN_KEYS)
    for note in keyed.notes:
        yield Finding(Severity.WARNING, path, str(note))
    misspelt = {note.written for note in keyed.notes if not note.read}  # its note names the key it may mean
    unknown = sorted(set(keyed.values) - KNOWN_KEYS - misspelt)
    if unknown:
        # shown: a key is anyone's text (a lone surrogate no terminal encodes, a newline forging a line)
        yield Finding(Severity.WARNING, path, f"keys ignored (not read by the proxy): {', '.join(map(shown, unknown))}")


BALLOONS_FILE = "balloons.json"  # what ``hook run balloons`` writes
SIZING_HOOKS = (HookType.PRE_CREATE_CONTAINER, HookType.PRE_UPDATE_CONTAINER_RESOURCES)


def _balloons_order(directory: Path, servers: Iterable[HookServerConfig]) -> Iterable[Finding]:
    """balloons sizes a container by the cpu_shares it is shown: a server called
    after it at the same hook point may set others (batchresource, koordlet for
    BE pods), which the container's later updates show it (docs/hook-balloons.md)."""
    by_name = {s.name: s for s in servers}
    balloons = by_name.get(BALLOONS_FILE)
    if balloons is None:
        return
    later = sorted(
        s.name for s in by_name.values()
        if s.sort_key > balloons.sort_key and any(h in s.hooks and h in balloons.hooks for h in SIZING_HOOKS)
    )
    if later:
        yield Finding(
            Severity.WARNING, directory / BALLOONS_FILE,
            f"called before {', '.join(later)}, which may set cpu_shares balloons would not see: balloons are sized by the "
            f"shares shown, so one may grow at a container's first update; give it a higher priority",
        )


def _suspicious(path: Path, server: HookServerConfig) -> Iterable[Finding]:
    for name in sorted(server.uncalled_hooks):
        yield Finding(Severity.WARNING, path, f"hook point {name} is never called (nor by koord-runtime-proxy); ignored")
    if not server.hooks:
        yield Finding(Severity.WARNING, path, "registers no runtime hooks; it will never be called")
    for hook in sorted(server.hooks, key=lambda h: h.value):
        if not _proxy_calls(hook):
            yield Finding(Severity.WARNING, path, f"hook point {hook.value} is never called by this proxy")
    peers: list[Peer] = []

    def read_peer(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):  # not told: no listener finding
            peers.append(peer_of(sock))

    endpoint = endpoint_findings(Path(server.endpoint), "remote-endpoint", read_peer)
    for finding in endpoint:
        yield Finding(finding.severity, path, f"{finding.reason} ({server.endpoint})")
    if not endpoint:  # a live socket: whose, and who listens on it
        yield from _socket_findings(path, server)
        for peer in peers:
            yield from _listener_findings(path, server, peer)
    yield from _key_findings(path)


def _socket_findings(path: Path, server: HookServerConfig) -> Iterable[Finding]:
    """The hook server's socket, when the proxy would refuse it for this file
    on either data path (endpointtrust.judge): its owner, or a directory (or
    a symlinked endpoint's) others may write to."""
    seen = look(server.endpoint)
    reason = judge(seen, server.owner_uid) if seen is not None else None
    if reason is not None:
        yield Finding(Severity.WARNING, path, f"remote-endpoint: {reason}: the proxy refuses its calls as "
                                              f"untrusted_endpoint ({server.endpoint})")


def _listener_findings(path: Path, server: HookServerConfig, peer: Peer) -> Iterable[Finding]:
    """The user that listens on the hook server's socket (``peer``:
    ``SO_PEERCRED`` of the probe's connect), when the proxy on the frames data
    path would refuse it for this file (endpointtrust.judge_peer: not root,
    the proxy's euid or the file's owner)."""
    if judge_peer(peer, server.owner_uid, server.endpoint) is None:
        return
    owner = f" or the hook file's owner (uid {server.owner_uid})" if server.owner_uid not in (None, 0) else ""
    yield Finding(
        Severity.WARNING, path,
        f"remote-endpoint: listened on by uid {peer.uid} (pid {peer.pid}), not root{owner}: the proxy refuses "
        f"its calls as untrusted_endpoint (frames data path); give the hook file to uid {peer.uid}, or have the "
        f"server listen as root ({server.endpoint})")


def _proxy_calls(hook: HookType) -> bool:
    """Whether the hook stage triggers ``hook`` on some CRI method."""
    point = HOOK_POINTS[hook]
    method = HOOKED_METHODS.get(point.cri_method)
    return method is not None and hook in (method.pre, method.post)
