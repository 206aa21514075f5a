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


def test_a_line_that_starts_where_the_bytes_read_start_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: the first line was left out whenever the file was larger than
    the bytes read, whole or not."""
    monkeypatch.setattr(process, "_TAIL_BYTES", 13)
    log = tmp_path / "containerd.log"
    log.write_text("first line\nsecond\nthird\n")  # the last 13 bytes: "second\nthird\n"
    assert tail(log, 10) == "second\nthird"


@pytest.mark.parametrize("content", [b"level=info msg=starting\n" + b"x" * 50 + b"\n", b"x" * 50],
                         ids=["a long last line", "no newline at all"])
def test_a_cut_line_that_is_all_there_is_comes_marked_as_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes,
) -> None:
    """Before: nothing came (`its log ... ends:` and no line)."""
    monkeypatch.setattr(process, "_TAIL_BYTES", 20)
    log = tmp_path / "containerd.log"
    log.write_bytes(content)
    assert tail(log) == "…" + "x" * (20 - content.endswith(b"\n"))


def test_a_log_that_grows_as_it_is_read_is_read_no_further_than_its_size_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: it was read to its end, however far containerd wrote meanwhile."""
    monkeypatch.setattr(process, "_TAIL_BYTES", 20)
    log = tmp_path / "containerd.log"
    log.write_text("first line\nsecond line\nthird line\n")

    class Growing:  # containerd writes more right after the size is taken
        def __init__(self, path: Path, mode: str) -> None:
            self.file = open(path, mode)  # noqa: SIM115

        def __enter__(self) -> Growing:
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.close()

        def seek(self, offset: int, whence: int = 0) -> int:
            at = self.file.seek(offset, whence)
            if whence == 2:
                with open(log, "ab") as out:
                    out.write(b"later line\n" * 1000)
            return at

        def read(self, size: int = -1) -> bytes:
            return self.file.read(size)

    monkeypatch.setattr(process, "open", Growing, raising=False)
    assert tail(log, 10) == "third line"


def test_since_leaves_out_the_lines_of_earlier_runs(tmp_path: Path) -> None:
    """Before: a run's error showed the last lines of the file, an earlier
    run's among them (every run on DIR appends to containerd.log)."""
    log = tmp_path / "containerd.log"
    log.write_bytes(b"level=fatal msg=\"an earlier run\"\n")
    since = log.stat().st_size
    assert tail(log, since=since) == ""
    with open(log, "ab") as out:
        out.write(b"level=info msg=\"this run\"\n")
    assert tail(log, since=since) == "level=info msg=\"this run\""
    assert tail(log) == "level=fatal msg=\"an earlier run\"\nlevel=info msg=\"this run\""
    log.write_bytes(b"cut meanwhile\n")  # shorter than since: read from its start
    assert tail(log, since=since) == "cut meanwhile"


def test_the_log_of_this_start_is_read_from_its_end_only(tmp_path: Path) -> None:
    """Before: LocalContainerd read its whole start's log at each refused poll."""
    from runtimeproxy.host.containerd import LocalContainerd

    runtime = LocalContainerd(tmp_path)
    runtime.log_path.write_bytes(b"level=info msg=\"an earlier run\"\n")
    runtime._log_start = runtime.log_path.stat().st_size
    with open(runtime.log_path, "ab") as out:
        out.write(b"x" * (2 * process._TAIL_BYTES) + b"\nlevel=info msg=\"containerd successfully booted\"\n")
    read = runtime._this_start_log()
    assert len(read) <= process._TAIL_BYTES and read.endswith(b"successfully booted\"\n")
    assert runtime.log_tail() == "level=info msg=\"containerd successfully booted\""
    runtime.log_path.write_bytes(b"level=info msg=\"an earlier run\"\nlevel=info msg=\"this start\"\n")
    assert runtime.log_tail() == "level=info msg=\"this start\""
