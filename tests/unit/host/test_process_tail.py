"""tail(): the last lines of a log file that only grows (containerd.log)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimeproxy.host import process
from runtimeproxy.host.process import tail


def test_a_large_log_is_read_from_its_end_only(tmp_path: Path) -> None:
    """Before: the whole file was read, every run's log since DIR was made."""
    log = tmp_path / "containerd.log"
    with open(log, "wb") as out:
        for n in range(400_000):  # about 11 MiB
            out.write(f"level=info msg=\"line {n}\"\n".encode())
        out.write(b"level=fatal msg=\"bad byte \xff\"\n")
    before = _bytes_read()
    got = tail(log, 3).splitlines()
    assert _bytes_read() - before < 1024 * 1024  # 64 KiB and some: not the 11 MiB
    assert got == ['level=info msg="line 399998"', 'level=info msg="line 399999"',
                   'level=fatal msg="bad byte \ufffd"']  # errors="replace"


def _bytes_read() -> int:
    """What this process read so far, all files (the kernel's count)."""
    return int(next(line for line in Path("/proc/self/io").read_text().splitlines()
                    if line.startswith("rchar:")).split()[1])


def test_no_cut_line_comes_first_when_more_lines_are_asked_than_the_bytes_read_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process, "_TAIL_BYTES", 20)
    log = tmp_path / "containerd.log"
    log.write_text("first line\nsecond line\nthird line\n")
    assert tail(log, 10) == "third line"  # "cond line" was cut: left out


def test_a_short_log_comes_whole_and_a_missing_one_is_named(tmp_path: Path) -> None:
    log = tmp_path / "containerd.log"
    log.write_text("one\ntwo\n")
    assert tail(log) == "one\ntwo"
    assert tail(tmp_path / "gone.log") == f"({tmp_path / 'gone.log'} not readable)"
