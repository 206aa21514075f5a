"""--local-containerd's directory: its sockets (containerd.sock and
containerd.sock.ttrpc) must fit a unix socket's path, counted in bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtimeproxy.host.containerd import LocalContainerd, LocalRuntimeError
from runtimeproxy.host.unixsocket import MAX_PATH


async def test_a_directory_too_long_in_bytes_but_not_in_characters_is_refused_before_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: its characters were counted, so a non-ASCII directory passed,
    then failed at containerd's bind."""
    def started(self: LocalContainerd) -> None:
        raise AssertionError("the length check let it through")

    monkeypatch.setattr(LocalContainerd, "_take_base", started)
    ttrpc = len(str(tmp_path / "x" / "containerd.sock.ttrpc")) - 1  # without the name below
    name = "é" * (MAX_PATH - ttrpc)  # fits in characters, twice that in bytes
    base = tmp_path / name
    assert len(str(base / "containerd.sock.ttrpc")) <= MAX_PATH < len(os.fsencode(base / "containerd.sock.ttrpc"))
    with pytest.raises(LocalRuntimeError) as refused:
        await LocalContainerd(base).start()
    assert str(refused.value) == f"base directory path too long for a unix socket: {base}"
    assert not base.exists()


async def test_a_directory_that_just_fits_gets_past_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def started(self: LocalContainerd) -> None:
        raise AssertionError("past the length check")

    monkeypatch.setattr(LocalContainerd, "_take_base", started)
    name = "d" * (MAX_PATH - (len(os.fsencode(tmp_path / "x" / "containerd.sock.ttrpc")) - 1))
    with pytest.raises(AssertionError, match="past the length check"):
        await LocalContainerd(tmp_path / name).start()
