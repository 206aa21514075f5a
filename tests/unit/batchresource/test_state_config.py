import json
from pathlib import Path

import pytest

from hooks.balloons import savedplan, savedreserved
from hooks.batchresource import state as statemodule
from hooks.batchresource.cgroups import CgroupDriver
from hooks.batchresource.config import BatchResourceConfig
from hooks.batchresource.state import PodRecord, SavedPod, StateDir
from hooks.builtin import HookConfigInvalid

RECORD = PodRecord("uid-1", "ns", "pod", "/kubepods/besteffort/poduid-1", '{"containers": {}}')


def test_state_round_trip_and_remove(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    assert state.load() == {}
    state.save(RECORD)
    state.save(PodRecord("uid-2", "ns", "other", "/p2", "{}"))
    assert StateDir(tmp_path / "state").load() == {
        "uid-1": SavedPod(RECORD), "uid-2": SavedPod(PodRecord("uid-2", "ns", "other", "/p2", "{}"))}
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["uid-1.json", "uid-2.json"]  # no temp files left
    state.remove("uid-1")
    state.remove("uid-1")  # twice is fine
    assert list(StateDir(tmp_path / "state").load()) == ["uid-2"]


def test_state_keeps_the_containers_the_hook_set_and_reads_a_file_without_them(tmp_path: Path) -> None:
    """The containers survive a restart; an older version's file (no
    ``containers`` key) reads as not known (None), not as none set."""
    state = StateDir(tmp_path)
    state.save(RECORD, frozenset({("main", 0), ("side", 2)}))
    assert json.loads((tmp_path / "uid-1.json").read_text())["containers"] == [["main", 0], ["side", 2]]
    state.save(PodRecord("uid-2", "ns", "other", "/p2", "{}"), frozenset())
    (tmp_path / "uid-3.json").write_text(json.dumps({"uid": "uid-3", "namespace": "ns", "name": "old", "cgroup_parent": "/p3",
                                                     "spec": "{}"}))
    loaded = state.load()
    assert {uid: pod.containers for uid, pod in loaded.items()} == {
        "uid-1": frozenset({("main", 0), ("side", 2)}), "uid-2": frozenset(), "uid-3": None}
    assert loaded["uid-1"].record == RECORD


def test_state_keeps_kubelets_swap_asks_and_reads_a_file_without_them(tmp_path: Path) -> None:
    """The swap asks survive a restart; a file without ``swap`` (an older
    version's, or a pod with none noted) reads as none known, and one with
    none is written without the key, as an older version wrote it."""
    state = StateDir(tmp_path)
    state.save(RECORD, frozenset({("main", 0)}), swap={"side": -1, "main": 0})
    assert json.loads((tmp_path / "uid-1.json").read_text())["swap"] == {"main": 0, "side": -1}
    state.save(PodRecord("uid-2", "ns", "other", "/p2", "{}"), swap={})
    assert "swap" not in json.loads((tmp_path / "uid-2.json").read_text())
    loaded = state.load()
    assert loaded["uid-1"] == SavedPod(RECORD, frozenset({("main", 0)}), {"main": 0, "side": -1})
    assert loaded["uid-2"].swap == {}


def test_state_skips_unreadable_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = StateDir(tmp_path)
    state.save(RECORD)
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "wrong.json").write_text(json.dumps({"uid": "x"}))
    (tmp_path / "list.json").write_text("[]")
    (tmp_path / "swap.json").write_text(json.dumps({**{"uid": "y", "namespace": "ns", "name": "n", "cgroup_parent": "/p",
                                                         "spec": "{}"}, "swap": [0]}))
    assert state.load() == {"uid-1": SavedPod(RECORD)}
    assert caplog.text.count("unreadable batchresource state file") == 4


def test_state_load_removes_temp_files_a_killed_hook_left(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A hook SIGKILLed between writing a record's temporary file and renaming it
    leaves the temporary file: the next start removes it (before: every such
    kill left one in the state directory for good). Only its own: a stateDir
    shared with balloons keeps balloons' reserved.json and the temporary file
    of its write (before: the glob ``.*.tmp`` removed it, maybe mid-write)."""
    state = StateDir(tmp_path)
    state.save(RECORD)
    (tmp_path / ".uid-2.json.k3j9x1.tmp").write_text('{"uid": "uid-2", "names')
    (tmp_path / "notes.tmp").write_text("not the hook's")  # not a name save() makes: left alone
    (tmp_path / ".notes.k3j9x1.tmp").write_text("not the hook's either")
    (tmp_path / "reserved.json").write_text('{"version": 1, "reserved_cpus": "0", "config": "x"}')
    (tmp_path / ".reserved.json.w1r2t3.tmp").write_text('{"version": 1, "reserv')  # balloons' write under way
    caplog.set_level("INFO")
    assert state.load() == {"uid-1": SavedPod(RECORD)}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".notes.k3j9x1.tmp", ".reserved.json.w1r2t3.tmp", "notes.tmp", "reserved.json", "uid-1.json"]
    removed = [r for r in caplog.records if r.getMessage() == "batchresource removed a temporary state file a stopped hook left"]
    assert [r.path for r in removed] == [str(tmp_path / ".uid-2.json.k3j9x1.tmp")]  # type: ignore[attr-defined]
    assert "unreadable batchresource state file" not in caplog.text  # balloons' reserved.json is not ours to read


def test_state_load_leaves_balloons_saved_balloons_and_their_temp_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stateDir shared with balloons holds its balloons.json too (beside
    reserved.json), and the temporary file of its write under way: neither
    read nor removed (before: balloons.json was read as a pod's file, an
    unreadable one warned of at every start, and the temporary file of its
    write removed, maybe mid-write, its rename then failing)."""
    state = StateDir(tmp_path)
    state.save(RECORD)
    theirs = ["balloons.json", ".balloons.json.w1r2t3.tmp", ".balloons.json.k3j9x_1q.tmp",
              "reserved.json", ".reserved.json.w1r2t3.tmp"]
    for name in theirs:
        (tmp_path / name).write_text('{"version": 1, "balloons": []}')
    caplog.set_level("INFO")
    assert state.load() == {"uid-1": SavedPod(RECORD)}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*theirs, "uid-1.json"])
    assert "unreadable batchresource state file" not in caplog.text
    assert "removed a temporary state file" not in caplog.text


def test_the_names_left_to_balloons_are_balloons_file_names() -> None:
    """Guards the list against a renamed or added balloons file (as balloons.json was added unseen)."""
    assert set(statemodule._NOT_OURS) == {savedreserved.FILE_NAME, savedplan.FILE_NAME}


def test_state_load_removes_an_older_versions_temp_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A version before the ``.<uid>.json.`` prefix named its temporary
    files ``.<uid>.<8 random characters>.tmp`` (mkstemp's): one a kill left
    is removed at the next start too (before: left for good, the glob taking
    today's names only). Not a name of another shape (a dot in the stem, 6
    random characters), nor balloons' (today's shape, a dotted stem)."""
    state = StateDir(tmp_path)
    state.save(RECORD)
    old = ".0b8f3c2e-6a7d-4c1e-9f3a-2d5e8b7c1a40.k3j9x_1q.tmp"
    (tmp_path / old).write_text('{"uid": "0b8f3c2e')
    kept = [".notes.k3j9x1.tmp", ".a.b.k3j9x_1q.tmp", ".reserved.json.k3j9x_1q.tmp", ".uid-3.K3J9X_1Q.tmp"]
    for name in kept:
        (tmp_path / name).write_text("not the hook's")
    caplog.set_level("INFO")
    assert state.load() == {"uid-1": SavedPod(RECORD)}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, "uid-1.json"])
    removed = [r for r in caplog.records if r.getMessage() == "batchresource removed a temporary state file a stopped hook left"]
    assert [r.path for r in removed] == [str(tmp_path / old)]  # type: ignore[attr-defined]


def test_a_record_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    StateDir(tmp_path).save(RECORD)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["uid-1.json"]


@pytest.mark.parametrize("uid", ["../x", "a/b", "..", ""])
def test_state_refuses_unsafe_uids(tmp_path: Path, uid: str) -> None:
    with pytest.raises(ValueError):
        StateDir(tmp_path).save(PodRecord(uid, "ns", "p", "/p", "{}"))


def test_config_defaults() -> None:
    config = BatchResourceConfig.from_mapping({})
    assert config == BatchResourceConfig()
    assert (config.cgroup_root, config.cgroup_driver, config.cgroup_version) == (Path("/sys/fs/cgroup"), CgroupDriver.AUTO, None)
    assert (config.state_dir, config.reconcile_interval, config.cfs_quota_enabled) == (
        Path("/var/lib/runtime-proxy/batchresource"), 10.0, True)


def test_config_values() -> None:
    config = BatchResourceConfig.from_mapping({
        "cgroup_root": "/tmp/cg", "cgroup_driver": "systemd", "cgroup_version": 2, "state_dir": "/tmp/st",
        "reconcile_interval": "500ms", "cfs_quota_enabled": False,
    })
    assert config == BatchResourceConfig(Path("/tmp/cg"), CgroupDriver.SYSTEMD, 2, Path("/tmp/st"), 0.5, False)
    assert BatchResourceConfig.from_mapping({"reconcile_interval": 3}).reconcile_interval == 3.0
    assert BatchResourceConfig.from_mapping({"cgroup_version": "auto"}).cgroup_version is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"interval": 1}, "unknown config keys"),
        ({"cgroup_root": "relative"}, "cgroup_root must be an absolute path"),
        ({"state_dir": 5}, "state_dir must be an absolute path"),
        ({"cgroup_driver": "docker"}, "cgroup_driver must be"),
        ({"cgroup_version": 3}, "cgroup_version must be"),
        ({"reconcile_interval": 0}, "must be positive"),
        ({"reconcile_interval": -1}, "must be positive"),
        ({"reconcile_interval": "10"}, "reconcile_interval"),
        ({"reconcile_interval": True}, "reconcile_interval"),
        ({"cfs_quota_enabled": "no"}, "cfs_quota_enabled must be true or false"),
    ],
)
def test_config_invalid(raw: dict, message: str) -> None:
    with pytest.raises(HookConfigInvalid, match=message):
        BatchResourceConfig.from_mapping(raw)


def laughs(levels: int) -> list:
    """What YAML builds of a billion laughs: nine references to the list before, ``levels`` deep."""
    value: list = ["x"] * 9
    for _ in range(levels):
        value = [value] * 9
    return value


@pytest.mark.parametrize("key", ["cgroup_root", "state_dir", "cgroup_driver", "cgroup_version", "reconcile_interval", "cfs_quota_enabled"])
def test_a_billion_laughs_in_a_value_is_shown_cut_short(key: str) -> None:
    # Printed out, the message was 28 MB at 7 levels (a ConfigMap's few hundred bytes).
    with pytest.raises(HookConfigInvalid) as err:
        BatchResourceConfig.from_mapping({key: laughs(7)})
    message = str(err.value)
    assert "got [[[...], [...], [...], [...], ...], [[" in message or ": [[[...], [...], [...], [...], ...], [[" in message
    assert len(message) < 400, message[:300]
