"""look and judge: who may own a hook server's socket, and where it may live."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from runtimeproxy.hookclient.endpointtrust import Peer, judge, judge_peer, look, peer_of

from ...hookprocs import NOBODY



def bound(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    return sock


def untrusted_reason(endpoint: Path, owner_uid: int | None = None) -> str | None:
    """Why a hook file owned by ``owner_uid`` may not call ``endpoint`` now, as a transport dialling it judges."""
    seen = look(str(endpoint))
    return None if seen is None else judge(seen, owner_uid)


def test_root_owned_socket_in_a_safe_directory_is_trusted(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    with bound(tmp_path / "h.sock"):
        assert untrusted_reason(tmp_path / "h.sock", owner_uid=0) is None


def test_socket_owned_by_the_hook_files_owner_is_trusted_and_by_anyone_else_not(tmp_path: Path) -> None:
    with bound(tmp_path / "h.sock"):
        os.chown(tmp_path / "h.sock", NOBODY, NOBODY)
        assert untrusted_reason(tmp_path / "h.sock", owner_uid=NOBODY) is None
        reason = untrusted_reason(tmp_path / "h.sock", owner_uid=1000)
        assert reason == (
            f"untrusted endpoint: socket {tmp_path / 'h.sock'} is owned by uid {NOBODY}, "
            "not root or the hook file's owner (uid 1000)"
        )
        assert untrusted_reason(tmp_path / "h.sock") is not None


def test_a_symlinked_endpoint_is_judged_by_its_target(tmp_path: Path) -> None:
    safe, shared = tmp_path / "safe", tmp_path / "shared"
    safe.mkdir(mode=0o755)
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with bound(shared / "real.sock"):
        (safe / "h.sock").symlink_to(shared / "real.sock")
        reason = untrusted_reason(safe / "h.sock")
        assert reason is not None and f"socket directory {shared} is writable by others (mode 1777)" in reason


def test_a_group_writable_directory_is_not_refused_a_missing_socket_is_left_to_the_call(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o775)
    with bound(tmp_path / "h.sock"):
        assert untrusted_reason(tmp_path / "h.sock") is None
    assert untrusted_reason(tmp_path / "gone.sock") is None


def test_every_owner_is_judged_as_before_whatever_the_proxys_euid(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Trusted: root, the proxy's euid, the hook file's owner (the rule as a set, as it was first written)."""
    os.chmod(tmp_path, 0o755)
    with bound(tmp_path / "h.sock"):
        for euid in (0, 1000, NOBODY):
            monkeypatch.setattr(os, "geteuid", lambda euid=euid: euid)
            for owner in (0, 1000, 1001, NOBODY):
                os.chown(tmp_path / "h.sock", owner, owner)
                for file_owner in (None, 0, 1000, NOBODY):
                    trusted = {0, euid} | ({file_owner} if file_owner is not None else set())
                    reason = untrusted_reason(tmp_path / "h.sock", owner_uid=file_owner)
                    assert (reason is None) is (owner in trusted), (euid, owner, file_owner, reason)


def test_the_socket_and_its_directory_are_read_again_at_every_look(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    with bound(tmp_path / "h.sock"):
        hook = tmp_path / "h.sock"
        assert untrusted_reason(hook) is None
        os.chmod(tmp_path, 0o777)  # made unsafe after a call
        assert untrusted_reason(hook) is not None
        os.chmod(tmp_path, 0o755)
        os.chown(tmp_path / "h.sock", NOBODY, NOBODY)  # replaced by another's, say
        assert untrusted_reason(hook) is not None


def test_a_symlinked_endpoint_in_a_directory_anyone_can_write_is_refused(tmp_path: Path) -> None:
    """Whoever can write the link's directory can point it at another socket
    (before: only the target's directory was judged)."""
    safe, shared = tmp_path / "safe", tmp_path / "shared"
    safe.mkdir(mode=0o755)
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with bound(safe / "real.sock"):
        (shared / "h.sock").symlink_to(safe / "real.sock")
        assert untrusted_reason(shared / "h.sock") == (
            f"untrusted endpoint: the endpoint is a symlink in {shared}, which is writable by others (mode 1777); "
            "anyone could point it at another socket"
        )
        os.chmod(shared, 0o755)
        assert untrusted_reason(shared / "h.sock") is None


def test_peer_of_a_connected_socket_is_the_process_that_listens() -> None:
    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right:
        assert peer_of(left) == Peer(os.getpid(), os.getuid(), os.getgid())


def test_a_server_run_by_a_user_trusted_to_own_its_socket_is_trusted_and_anyone_else_not() -> None:
    for uid, owner_uid in ((0, None), (os.geteuid(), None), (NOBODY, NOBODY)):
        assert judge_peer(Peer(42, uid, uid), owner_uid, "/e") is None, (uid, owner_uid)
    assert judge_peer(Peer(42, NOBODY, NOBODY), 1001, "/e") == (
        f"untrusted endpoint: the server connected to at /e: pid 42 listened on it as uid {NOBODY}, "
        "not root or the hook file's owner (uid 1001); was the socket replaced after it was checked, "
        "or is it listened on by a user not trusted to own it?"
    )
