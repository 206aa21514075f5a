"""The periodic safety rescan of a directory where nothing changed costs a
fingerprint (a few stats and a listing), and still finds every change a full
rescan finds, with no event.

Real files in tmp_path. Each change is made after the registry has settled
into quiet rescans, and the outcome is compared with a full rescan's (one
naming a file that does not exist: it reads what changed, as the periodic one does).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from runtimeproxy.hookpath import registry as registry_module
from runtimeproxy.metrics import HookConfigMetrics
from runtimeproxy.hookpath.registry import HookRegistry, ReloadResult

from . import registrydir
from .registrydir import valid_doc, write

hook_dir = registrydir.hook_dir


def _outcome(result: ReloadResult) -> tuple[object, ...]:
    return (result.added, result.changed, result.removed, dict(result.rejected), result.kept,
            result.directory_error, result.directory_unsafe, result.directory_kept,
            {name: config.endpoint for name, config in result.snapshot.servers.items()})


def _full(registry: HookRegistry) -> ReloadResult:
    return registry.rescan(["no-such-file.json"])  # names a file: never the quiet path


class _Scans:
    """Counts full scans (each inspects the directory)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = registry_module.inspect_directory

        def counting(*args: object, **kwargs: object) -> object:
            self.count += 1
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(registry_module, "inspect_directory", counting)


def _settled(hook_dir: Path, scans: _Scans) -> tuple[HookRegistry, HookRegistry, ReloadResult]:
    """Two registries of ``hook_dir``: one rescanned periodically until quiet, one rescanned in full."""
    quiet, full = HookRegistry(hook_dir), HookRegistry(hook_dir)
    quiet.reload()
    full.reload()
    quiet.rescan()  # reads nothing: the next one with nothing changed is quiet
    before = scans.count
    settled = quiet.rescan()
    assert scans.count == before, "a rescan of an unchanged directory scans nothing"
    return quiet, full, settled


def test_quiet_rescans_scan_nothing_and_answer_what_a_full_rescan_would(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(hook_dir, "good.json", valid_doc())
    write(hook_dir, "bad.json", {"remote-endpoint": "relative.sock"})
    scans = _Scans(monkeypatch)
    quiet, full, _ = _settled(hook_dir, scans)
    before = scans.count
    results = [quiet.rescan() for _ in range(5)]
    assert scans.count == before
    assert all(_outcome(r) == _outcome(_full(full)) for r in results)
    assert "bad.json" in results[0].rejected and "good.json" in results[0].snapshot.servers


def _edit_in_place(d: Path) -> None:
    with open(d / "good.json", "w") as f:  # same inode: only its mtime and size say so
        f.write('{"remote-endpoint": "/run/edited-in-place.sock", "runtime-hooks": ["PreCreateContainer"]}')


def _rewrite_keeping_size_and_mtime(d: Path) -> None:
    """As ``cp -p``, ``rsync --inplace -t`` or ``tar x`` rewrite a file: in
    place, here at the same size, and its mtime put back; only its ctime says so."""
    path = d / "good.json"
    before = os.stat(path)
    text = path.read_text().replace("/run/hook.sock", "/run/hoox.sock")
    assert len(text) == before.st_size
    with open(path, "r+") as f:
        f.write(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    while os.stat(path).st_ctime_ns == before.st_ctime_ns:  # (within the clock's tick: its next one)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


def _make_dir_a_file(d: Path) -> None:
    os.rmdir(d / "odd.json")
    write(d, "odd.json", valid_doc("/run/odd.sock"))


def _within_the_same_tick(change: Callable[[Path], object]) -> Callable[[Path], None]:
    """``change``, with the directory's mtime put back: as when it lands in the
    same clock tick as the last scan's stat (timestamps are coarser than ns)."""

    def changed(d: Path) -> None:
        st = os.stat(d)
        change(d)
        os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))

    return changed


CHANGES: dict[str, Callable[[Path], object]] = {
    "file added": lambda d: write(d, "new.json", valid_doc("/run/new.sock")),
    "file removed": lambda d: os.unlink(d / "good.json"),
    "file replaced": lambda d: write(d, "good.json", valid_doc("/run/replaced.sock")),
    "file edited in place": _edit_in_place,
    "file rewritten in place, same size, mtime put back": _rewrite_keeping_size_and_mtime,
    "file renamed": lambda d: os.rename(d / "good.json", d / "renamed.json"),
    "file renamed within the tick": _within_the_same_tick(lambda d: os.rename(d / "good.json", d / "good2.json")),
    "file made group-writable": lambda d: os.chmod(d / "good.json", 0o664),
    "bad file fixed": lambda d: write(d, "bad.json", valid_doc("/run/fixed.sock")),
    "directory made unsafe": lambda d: os.chmod(d, 0o777),
    "symlinked file's target swapped": registrydir.configmap_update,
    "symlink target's directory made unsafe": lambda d: os.chmod(d / "v1", 0o777),
    "sub-directory named .json made a file": _make_dir_a_file,
}


@pytest.mark.parametrize("change", CHANGES)
def test_every_change_is_found_by_the_periodic_rescan_without_an_event(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    write(hook_dir, "good.json", valid_doc())
    write(hook_dir, "bad.json", {"remote-endpoint": "relative.sock"})
    (hook_dir / "odd.json").mkdir(mode=0o755)  # skipped: a directory
    registrydir.configmap_volume(hook_dir, "linked.json")
    scans = _Scans(monkeypatch)
    quiet, full, settled = _settled(hook_dir, scans)

    CHANGES[change](hook_dir)
    found = quiet.rescan()
    assert _outcome(found) == _outcome(_full(full))
    assert _outcome(found) != _outcome(settled), "the change was seen"
    if found.directory_unsafe:
        return  # an unsafe directory is scanned in full at each rescan, as before
    quiet.rescan()  # quiet again once the change is taken in
    before = scans.count
    assert _outcome(quiet.rescan()) == _outcome(_full(full))
    assert scans.count == before + 1  # the full one's


def test_every_few_minutes_the_periodic_rescan_reads_every_file_whatever_its_stat(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file rewritten twice within one tick of the filesystem's clock keeps
    the stat a rescan between the two saw: stat identities (the files' and the
    directory's fingerprint) are made blind here, as they are then."""
    write(hook_dir, "good.json", valid_doc("/run/before.sock"))
    monkeypatch.setattr(registry_module, "file_identity", lambda path: ("same",))
    monkeypatch.setattr(registry_module, "directory_fingerprint", lambda directory: ("same",))
    interval = registry_module.FULL_REREAD_SECONDS / 3  # every third periodic rescan reads every file
    registry = HookRegistry(hook_dir, resync_interval=interval)
    registry.reload()
    write(hook_dir, "good.json", valid_doc("/run/after.sock"))
    assert registry.rescan().snapshot.servers["good.json"].endpoint == "/run/before.sock"
    assert registry.rescan().snapshot.servers["good.json"].endpoint == "/run/before.sock"
    third = registry.rescan()
    assert third.changed == ("good.json",) and third.snapshot.servers["good.json"].endpoint == "/run/after.sock"
    write(hook_dir, "good.json", valid_doc("/run/again.sock"))
    assert [registry.rescan().snapshot.servers["good.json"].endpoint for _ in range(3)] == [
        "/run/after.sock", "/run/after.sock", "/run/again.sock",  # counted from the last full read
    ]


def test_a_directory_usable_again_settles_into_quiet_rescans_with_its_gauges_at_0(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(hook_dir, "good.json", valid_doc())
    collected = CollectorRegistry()
    registry = HookRegistry(hook_dir, metrics=HookConfigMetrics(collected))

    def gauges() -> tuple[float | None, ...]:
        return tuple(collected.get_sample_value(f"runtime_proxy_hook_dir_{name}") for name in ("refused", "kept"))

    registry.reload()
    os.chmod(hook_dir, 0o777)
    assert registry.rescan().directory_kept
    assert gauges() == (1, 1)
    os.chmod(hook_dir, 0o755)
    assert registry.rescan().directory_error is None
    scans = _Scans(monkeypatch)
    registry.rescan()  # read nothing: quiet from the next one on
    before = scans.count
    result = registry.rescan()
    assert scans.count == before and result.directory_error is None and "good.json" in result.snapshot.servers
    assert gauges() == (0, 0)

