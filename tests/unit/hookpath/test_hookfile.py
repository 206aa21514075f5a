"""Tests of runtimeproxy.hookconfig: hook file parsing, permission safety, the registry and its watcher.

Real files in tmp_path, the real watchfiles watcher; no sleeps where an event can
be awaited.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from runtimeproxy.hookpath import hookfile as hookconfig
from runtimeproxy.hookpath.hookfile import (
    DEFAULT_PRIORITY,
    DEFAULT_TIMEOUT,
    FailurePolicy,
    HookConfigError,
    HookRegistry,
    HookServerConfig,
    HookSnapshot,
    HookType,
    format_duration,
    parse_duration,
    parse_hook_file,
)

LOGGER = "runtimeproxy.hookpath.hookfile"

# Exactly what Koordinator's koordlet writes (no timeout/priority keys).
KOORDINATOR_DOC = {
    "remote-endpoint": "/var/run/koordlet/koordlet.sock",
    "failure-policy": "Ignore",
    "runtime-hooks": [
        "PreRunPodSandbox",
        "PreCreateContainer",
        "PreStartContainer",
        "PreUpdateContainerResources",
        "PostStopPodSandbox",
    ],
}


def valid_doc(endpoint: str = "/run/hook.sock", **extra: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "remote-endpoint": endpoint,
        "failure-policy": "Fail",
        "runtime-hooks": ["PreCreateContainer"],
    }
    doc.update(extra)
    return doc


def write(directory: Path, name: str, content: object, mode: int = 0o644) -> Path:
    """Write a hook file (JSON-encoding non-str content) with an explicit mode, atomically."""
    path = directory / name
    text = content if isinstance(content, str) else json.dumps(content)
    tmp = directory / f".{name}.tmp"
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return path


@pytest.fixture
def hook_dir(tmp_path: Path) -> Path:
    d = tmp_path / "hookserver.d"
    d.mkdir()
    os.chmod(d, 0o755)
    return d


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("2m", 120.0),
        ("1m30s", 90.0),
        ("1h", 3600.0),
        (".5s", 0.5),
        ("250us", 0.00025),
        ("250µs", 0.00025),
        ("100ns", 1e-7),
        ("0s", 0.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("text", ["", "1", "2", "-1s", "+1s", "1x", "s", "1 s", " 1s", "1s ", "1.5.5s", "1e3s", "inf", "1S"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize("value", [1, 1.5, None, [], {}])
def test_parse_duration_rejects_non_strings(value: object) -> None:
    with pytest.raises(ValueError, match="must be a string"):
        parse_duration(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seconds", "text"), [(2.0, "2s"), (0.5, "500ms"), (1.5, "1.5s"), (120, "120s"), (0.0001, "100us"), (1e-7, "100ns")]
)
def test_format_duration_round_trips(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("seconds", [0, -1, float("inf"), float("nan")])
def test_format_duration_rejects_non_positive(seconds: float) -> None:
    with pytest.raises(ValueError):
        format_duration(seconds)


# --------------------------------------------------------------------------- parsing


def test_koordinator_format_loads_with_defaults(hook_dir: Path) -> None:
    path = write(hook_dir, "koordlet.json", json.dumps(KOORDINATOR_DOC, indent=2))
    cfg = parse_hook_file(path)
    assert cfg == HookServerConfig(
        name="koordlet.json",
        endpoint="/var/run/koordlet/koordlet.sock",
        failure_policy=FailurePolicy.IGNORE,
        hooks=frozenset(
            {
                HookType.PRE_RUN_POD_SANDBOX,
                HookType.PRE_CREATE_CONTAINER,
                HookType.PRE_START_CONTAINER,
                HookType.PRE_UPDATE_CONTAINER_RESOURCES,
                HookType.POST_STOP_POD_SANDBOX,
            }
        ),
        timeout=DEFAULT_TIMEOUT,
        priority=DEFAULT_PRIORITY,
    )
    assert cfg.timeout == 2.0 and cfg.priority == 0


def test_all_seven_hook_names_and_optional_keys(hook_dir: Path) -> None:
    doc = valid_doc(timeout="1.5s", priority=-3)
    doc["runtime-hooks"] = [h.value for h in HookType]
    cfg = parse_hook_file(write(hook_dir, "all.json", doc))
    assert cfg.hooks == frozenset(HookType)
    assert len(HookType) == 7
    assert cfg.failure_policy is FailurePolicy.FAIL
    assert cfg.timeout == 1.5
    assert cfg.priority == -3


def test_hook_type_rpc_names_match_the_service() -> None:
    from cri_api.hookapi import api_pb2

    service = api_pb2.DESCRIPTOR.services_by_name["RuntimeHookService"]
    assert {m.name for m in service.methods} == {h.rpc_name for h in HookType}
    for hook in HookType:
        expected = "PodSandboxHookRequest" if hook.is_pod_hook else "ContainerResourceHookRequest"
        assert service.methods_by_name[hook.rpc_name].input_type.name == expected


@pytest.mark.parametrize("policy_doc", [{}, {"failure-policy": ""}, {"failure-policy": None}])
def test_failure_policy_optional_like_koordinator(hook_dir: Path, policy_doc: dict[str, object]) -> None:
    doc: dict[str, object] = {"remote-endpoint": "/run/x.sock", "runtime-hooks": ["PreStartContainer"], **policy_doc}
    cfg = parse_hook_file(write(hook_dir, "p.json", doc))
    assert cfg.failure_policy is FailurePolicy.IGNORE


@pytest.mark.parametrize("hooks_doc", [{}, {"runtime-hooks": []}, {"runtime-hooks": None}])
def test_runtime_hooks_optional_like_koordinator(hook_dir: Path, hooks_doc: dict[str, object]) -> None:
    doc: dict[str, object] = {"remote-endpoint": "/run/x.sock", **hooks_doc}
    cfg = parse_hook_file(write(hook_dir, "h.json", doc))
    assert cfg.hooks == frozenset()


def test_unknown_keys_ignored_with_debug_log(hook_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    cfg = parse_hook_file(write(hook_dir, "extra.json", valid_doc(comment="hi", **{"x-vendor": 1})))
    assert cfg.endpoint == "/run/hook.sock"
    records = [r for r in caplog.records if getattr(r, "hook_unknown_keys", None)]
    assert len(records) == 1
    assert records[0].levelno == logging.DEBUG
    assert records[0].hook_unknown_keys == ["comment", "x-vendor"]  # type: ignore[attr-defined]
    assert records[0].hook_file == "extra.json"  # type: ignore[attr-defined]


def test_duplicate_hook_names_are_collapsed(hook_dir: Path) -> None:
    doc = valid_doc()
    doc["runtime-hooks"] = ["PreCreateContainer", "PreCreateContainer"]
    assert parse_hook_file(write(hook_dir, "d.json", doc)).hooks == frozenset({HookType.PRE_CREATE_CONTAINER})


INVALID_CASES: dict[str, tuple[object, str]] = {
    "bad-json.json": ('{"remote-endpoint": "/run/x.sock",', "invalid JSON"),
    "empty.json": ("", "file is empty"),
    "array.json": ([valid_doc()], "must be an object, got array"),
    "string.json": ('"hello"', "must be an object, got string"),
    "unknown-hook.json": (valid_doc(**{"runtime-hooks": ["PreCreateContainer", "PreRemoveRunPodSandbox"]}), "unknown runtime hook 'PreRemoveRunPodSandbox'"),
    "unknown-hook-case.json": (valid_doc(**{"runtime-hooks": ["precreatecontainer"]}), "unknown runtime hook 'precreatecontainer'"),
    "hooks-not-list.json": (valid_doc(**{"runtime-hooks": "PreCreateContainer"}), '"runtime-hooks" must be a list'),
    "hook-not-string.json": (valid_doc(**{"runtime-hooks": [1]}), "entries must be strings"),
    "unknown-policy.json": (valid_doc(**{"failure-policy": "Retry"}), "unknown \"failure-policy\" 'Retry'"),
    "policy-lowercase.json": (valid_doc(**{"failure-policy": "fail"}), "unknown \"failure-policy\" 'fail'"),
    "policy-not-string.json": (valid_doc(**{"failure-policy": True}), '"failure-policy" must be a string'),
    "missing-endpoint.json": ({"failure-policy": "Fail", "runtime-hooks": ["PreCreateContainer"]}, 'missing "remote-endpoint"'),
    "empty-endpoint.json": (valid_doc(endpoint=""), '"remote-endpoint" is empty'),
    "blank-endpoint.json": (valid_doc(endpoint="   "), '"remote-endpoint" is empty'),
    "relative-endpoint.json": (valid_doc(endpoint="run/hook.sock"), "must be an absolute socket path"),
    "unix-scheme-endpoint.json": (valid_doc(endpoint="unix:///run/hook.sock"), "must be an absolute socket path"),
    "endpoint-not-string.json": (valid_doc(endpoint=42), '"remote-endpoint" must be a string'),  # type: ignore[arg-type]
    "timeout-no-unit.json": (valid_doc(timeout="2"), 'bad "timeout"'),
    "timeout-garbage.json": (valid_doc(timeout="soon"), 'bad "timeout"'),
    "timeout-zero.json": (valid_doc(timeout="0s"), "must be greater than zero"),
    "timeout-negative.json": (valid_doc(timeout="-1s"), 'bad "timeout"'),
    "timeout-number.json": (valid_doc(timeout=2), '"timeout" must be a duration string'),
    "timeout-too-long.json": (valid_doc(timeout="121s"), "more than the limit of 120s"),
    "huge-integer.json": ('{"remote-endpoint": "/run/x.sock", "priority": 1' + "0" * 5000 + "}", "invalid JSON"),
    "surrogate-endpoint.json": ('{"remote-endpoint": "/run/\\udc80.sock"}', "not a valid UTF-8 path"),
    "long-endpoint.json": (valid_doc(endpoint="/run/" + "a" * 103), "a unix socket path has at most 107"),
    "priority-float.json": (valid_doc(priority=1.5), '"priority" must be an integer'),
    "priority-string.json": (valid_doc(priority="1"), '"priority" must be an integer'),
    "priority-bool.json": (valid_doc(priority=True), '"priority" must be an integer'),
}


@pytest.mark.parametrize("name", sorted(INVALID_CASES))
def test_invalid_file_rejected_with_reason_naming_file(hook_dir: Path, name: str) -> None:
    content, reason = INVALID_CASES[name]
    path = write(hook_dir, name, content)
    with pytest.raises(HookConfigError) as excinfo:
        parse_hook_file(path)
    assert excinfo.value.path == path
    assert reason in excinfo.value.reason
    assert name in str(excinfo.value)


def test_non_utf8_rejected(hook_dir: Path) -> None:
    path = hook_dir / "latin1.json"
    path.write_bytes(b'{"remote-endpoint": "/run/\xe9.sock"}')
    os.chmod(path, 0o644)
    with pytest.raises(HookConfigError, match="latin1.json.*not valid UTF-8"):
        parse_hook_file(path)


def test_registry_rejects_invalid_files_while_others_load(hook_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    for name, (content, _) in INVALID_CASES.items():
        write(hook_dir, name, content)
    write(hook_dir, "good-a.json", valid_doc("/run/a.sock"))
    write(hook_dir, "good-b.json", KOORDINATOR_DOC)

    registry = HookRegistry(hook_dir)
    result = registry.reload()

    assert result.directory_error is None
    assert result.added == ("good-a.json", "good-b.json")
    assert set(registry.snapshot.servers) == {"good-a.json", "good-b.json"}
    assert set(result.rejected) == set(INVALID_CASES)
    for name, (_, reason) in INVALID_CASES.items():
        assert reason in result.rejected[name]
    # One error line per rejected file, naming it and the reason.
    rejected_logs = {r.hook_file: r for r in caplog.records if getattr(r, "hook_event", None) == "rejected"}  # type: ignore[attr-defined]
    assert set(rejected_logs) == set(INVALID_CASES)
    for name, record in rejected_logs.items():
        assert record.levelno == logging.ERROR
        assert name in record.getMessage()
        assert record.reason == result.rejected[name]  # type: ignore[attr-defined]
    loaded_logs = [r for r in caplog.records if getattr(r, "hook_event", None) == "loaded"]
    assert {r.hook_file for r in loaded_logs} == {"good-a.json", "good-b.json"}  # type: ignore[attr-defined]
    koord = next(r for r in loaded_logs if r.hook_file == "good-b.json")  # type: ignore[attr-defined]
    assert koord.hook_endpoint == "/var/run/koordlet/koordlet.sock"  # type: ignore[attr-defined]
    assert "PreCreateContainer" in koord.hook_points  # type: ignore[attr-defined]
    assert "/var/run/koordlet/koordlet.sock" in koord.getMessage()

    # A second reload with nothing changed neither changes anything nor re-logs the rejections.
    caplog.clear()
    again = registry.reload()
    assert not again.modified
    assert again.snapshot is result.snapshot
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]


def test_non_json_hidden_and_directories_ignored(hook_dir: Path) -> None:
    write(hook_dir, "hook.json", valid_doc())
    write(hook_dir, "README", "not a hook")
    write(hook_dir, "hook.json.bak", valid_doc("/run/bak.sock"))
    write(hook_dir, ".hidden.json", valid_doc("/run/hidden.sock"))
    (hook_dir / "sub.json").mkdir()
    write(hook_dir / "sub.json", "nested.json", valid_doc("/run/nested.sock"))
    result = HookRegistry(hook_dir).reload()
    assert list(result.snapshot.servers) == ["hook.json"]
    assert not result.rejected


# --------------------------------------------------------------------------- permission safety


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666, 0o620, 0o602])
def test_group_or_other_writable_file_refused(hook_dir: Path, mode: int) -> None:
    path = write(hook_dir, "loose.json", valid_doc(), mode=mode)
    with pytest.raises(HookConfigError, match=r"loose\.json.*refused.*writable by") as excinfo:
        parse_hook_file(path)
    assert f"{mode:04o}" in excinfo.value.reason
    write(hook_dir, "tight.json", valid_doc("/run/t.sock"), mode=0o600)
    result = HookRegistry(hook_dir).reload()
    assert list(result.snapshot.servers) == ["tight.json"]
    assert "writable by" in result.rejected["loose.json"]


def test_permission_check_can_be_disabled(hook_dir: Path) -> None:
    path = write(hook_dir, "loose.json", valid_doc(), mode=0o666)
    assert parse_hook_file(path, check_permissions=False).name == "loose.json"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_file_not_owned_by_root_refused(hook_dir: Path) -> None:
    path = write(hook_dir, "foreign.json", valid_doc())
    os.chown(path, 12345, 12345)
    with pytest.raises(HookConfigError, match=r"foreign\.json.*owned by uid 12345"):
        parse_hook_file(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_directory_not_owned_by_root_refused(hook_dir: Path) -> None:
    write(hook_dir, "hook.json", valid_doc())
    os.chown(hook_dir, 12345, 12345)
    result = HookRegistry(hook_dir).reload()
    assert result.directory_error is not None and "owned by uid 12345" in result.directory_error
    assert len(result.snapshot) == 0


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_group_or_other_writable_directory_refused(
    hook_dir: Path, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    write(hook_dir, "hook.json", valid_doc())
    registry = HookRegistry(hook_dir)
    assert list(registry.reload().snapshot.servers) == ["hook.json"]
    seen: list[HookSnapshot] = []
    registry.on_change(seen.append)

    os.chmod(hook_dir, mode)
    result = registry.reload()
    # No hooks load at all, and the previously loaded ones are dropped.
    assert result.directory_error is not None
    assert "refusing to load any hook" in result.directory_error and "writable by" in result.directory_error
    assert result.removed == ("hook.json",)
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER) == ()
    assert len(seen) == 1 and len(seen[0]) == 0
    assert any(r.levelno == logging.ERROR and "refusing to load any hook" in r.getMessage() for r in caplog.records)

    os.chmod(hook_dir, 0o755)
    assert registry.reload().added == ("hook.json",)


def test_group_writable_directory_refused_from_start(hook_dir: Path) -> None:
    write(hook_dir, "hook.json", valid_doc())
    os.chmod(hook_dir, 0o775)
    result = HookRegistry(hook_dir).reload()
    assert result.directory_error and "writable by group" in result.directory_error
    assert len(result.snapshot) == 0 and not result.modified


def test_symlink_to_safe_target_loads(tmp_path: Path, hook_dir: Path) -> None:
    store = tmp_path / "store"
    store.mkdir(mode=0o755)
    target = write(store, "real.json", valid_doc("/run/real.sock"))
    (hook_dir / "linked.json").symlink_to(target)
    cfg = parse_hook_file(hook_dir / "linked.json")
    assert cfg.name == "linked.json" and cfg.endpoint == "/run/real.sock"


def test_symlink_to_unsafe_target_refused(tmp_path: Path, hook_dir: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    os.chmod(store, 0o755)
    target = write(store, "real.json", valid_doc(), mode=0o666)
    (hook_dir / "linked.json").symlink_to(target)
    with pytest.raises(HookConfigError, match=r"linked\.json.*symlink target .*real\.json is writable by"):
        parse_hook_file(hook_dir / "linked.json")


def test_symlink_into_unsafe_directory_refused(tmp_path: Path, hook_dir: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    target = write(store, "real.json", valid_doc())
    os.chmod(store, 0o777)
    (hook_dir / "linked.json").symlink_to(target)
    with pytest.raises(HookConfigError, match=r"linked\.json.*symlink target directory .*writable by"):
        parse_hook_file(hook_dir / "linked.json")


def test_dangling_symlink_rejected(hook_dir: Path) -> None:
    (hook_dir / "dangling.json").symlink_to(hook_dir / "nowhere.json")
    result = HookRegistry(hook_dir).reload()
    assert "dangling symlink" in result.rejected["dangling.json"]


def test_fifo_rejected_without_blocking(hook_dir: Path) -> None:
    os.mkfifo(hook_dir / "fifo.json", 0o644)
    with pytest.raises(HookConfigError, match="not a regular file"):
        parse_hook_file(hook_dir / "fifo.json")


# --------------------------------------------------------------------------- registry


def test_ordering_by_priority_then_file_name(hook_dir: Path) -> None:
    write(hook_dir, "b.json", valid_doc("/run/b.sock", priority=10))
    write(hook_dir, "a.json", valid_doc("/run/a.sock", priority=10))
    write(hook_dir, "z.json", valid_doc("/run/z.sock", priority=-5))
    write(hook_dir, "m.json", valid_doc("/run/m.sock"))  # default 0
    write(hook_dir, "c.json", valid_doc("/run/c.sock", **{"runtime-hooks": ["PreStartContainer"]}))
    registry = HookRegistry(hook_dir)
    registry.reload()
    assert [s.name for s in registry.servers_for(HookType.PRE_CREATE_CONTAINER)] == ["z.json", "m.json", "a.json", "b.json"]
    assert [s.name for s in registry.servers_for(HookType.PRE_START_CONTAINER)] == ["c.json"]
    assert registry.servers_for(HookType.POST_STOP_CONTAINER) == ()
    assert isinstance(registry.servers_for(HookType.PRE_CREATE_CONTAINER), tuple)


def test_missing_directory_means_no_hooks(tmp_path: Path) -> None:
    registry = HookRegistry(tmp_path / "absent")
    result = registry.reload()
    assert result.directory_error is not None and "does not exist" in result.directory_error
    assert len(result.snapshot) == 0
    assert registry.servers_for(HookType.PRE_RUN_POD_SANDBOX) == ()


def test_directory_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    result = HookRegistry(tmp_path / "file").reload()
    assert result.directory_error is not None and "not a directory" in result.directory_error


def test_reload_reports_added_changed_removed_and_notifies(hook_dir: Path) -> None:
    registry = HookRegistry(hook_dir)
    seen: list[HookSnapshot] = []
    unsubscribe = registry.on_change(seen.append)

    write(hook_dir, "a.json", valid_doc("/run/a.sock"))
    write(hook_dir, "b.json", valid_doc("/run/b.sock"))
    r1 = registry.reload()
    assert (r1.added, r1.changed, r1.removed) == (("a.json", "b.json"), (), ())
    assert len(seen) == 1 and seen[0] is registry.snapshot
    assert seen[0].endpoints == {"/run/a.sock", "/run/b.sock"}

    # Touching a file without changing its content is not a change.
    os.utime(hook_dir / "a.json")
    assert not registry.reload().modified
    assert len(seen) == 1

    write(hook_dir, "a.json", valid_doc("/run/a2.sock"))
    (hook_dir / "b.json").unlink()
    write(hook_dir, "c.json", valid_doc("/run/c.sock"))
    r2 = registry.reload()
    assert (r2.added, r2.changed, r2.removed) == (("c.json",), ("a.json",), ("b.json",))
    assert len(seen) == 2
    assert seen[1].endpoints == {"/run/a2.sock", "/run/c.sock"}
    # Old snapshots are immutable and unaffected.
    assert seen[0].servers["a.json"].endpoint == "/run/a.sock"
    assert seen[1].generation == seen[0].generation + 1
    with pytest.raises(TypeError):
        seen[1].servers["x"] = seen[1].servers["a.json"]  # type: ignore[index]

    unsubscribe()
    (hook_dir / "c.json").unlink()
    assert registry.reload().removed == ("c.json",)
    assert len(seen) == 2


def test_failing_callback_does_not_break_reload(hook_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    registry = HookRegistry(hook_dir)
    seen: list[HookSnapshot] = []

    def boom(_: HookSnapshot) -> None:
        raise RuntimeError("boom")

    registry.on_change(boom)
    registry.on_change(seen.append)
    write(hook_dir, "a.json", valid_doc())
    assert registry.reload().added == ("a.json",)
    assert len(seen) == 1
    assert any("callback" in r.getMessage() and r.exc_info for r in caplog.records)


def test_broken_edit_keeps_last_good_version(hook_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    registry = HookRegistry(hook_dir)
    write(hook_dir, "hook.json", valid_doc("/run/good.sock"))
    good = registry.reload().snapshot.servers["hook.json"]

    write(hook_dir, "hook.json", '{"remote-endpoint": "/run/good.sock", "runtime-hooks": ["PreCreateContainer"')
    result = registry.reload()
    assert not result.modified
    assert result.kept == ("hook.json",)
    assert "invalid JSON" in result.rejected["hook.json"]
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER) == (good,)
    record = next(r for r in caplog.records if getattr(r, "hook_event", None) == "rejected")
    assert "keeping its last good version" in record.getMessage()
    assert record.hook_kept_last_good is True  # type: ignore[attr-defined]

    # An unsafe edit is treated the same way.
    write(hook_dir, "hook.json", valid_doc("/run/evil.sock"), mode=0o666)
    result = registry.reload()
    assert result.kept == ("hook.json",) and "writable by" in result.rejected["hook.json"]
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER) == (good,)

    # Fixing it takes effect; deleting it removes it.
    write(hook_dir, "hook.json", valid_doc("/run/fixed.sock"))
    assert registry.reload().changed == ("hook.json",)
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER)[0].endpoint == "/run/fixed.sock"
    (hook_dir / "hook.json").unlink()
    assert registry.reload().removed == ("hook.json",)


def test_longest_socket_path_is_accepted(hook_dir: Path) -> None:
    endpoint = "/run/" + "a" * 102
    assert parse_hook_file(write(hook_dir, "long.json", valid_doc(endpoint))).endpoint == endpoint


def test_unexpected_error_on_one_file_keeps_it_and_loads_the_others(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever goes wrong reading one file (here: a bug) is that file's rejection, never the registry's."""
    registry = HookRegistry(hook_dir)
    write(hook_dir, "odd.json", valid_doc("/run/odd.sock"))
    good = registry.reload().snapshot.servers["odd.json"]
    real_parse = hookconfig.parse_hook_file

    def parse(path: Path, check_permissions: bool = True) -> HookServerConfig:
        if Path(path).name == "odd.json":
            raise RuntimeError("boom")
        return real_parse(path, check_permissions=check_permissions)

    monkeypatch.setattr(hookconfig, "parse_hook_file", parse)
    write(hook_dir, "other.json", valid_doc("/run/other.sock"))
    result = registry.reload()
    assert result.added == ("other.json",)
    assert result.kept == ("odd.json",)
    assert result.rejected["odd.json"] == "cannot be read: RuntimeError: boom"
    assert registry.snapshot.servers["odd.json"] == good
    assert any("boom" in r.getMessage() for r in caplog.records if getattr(r, "hook_event", None) == "rejected")


def test_invalid_file_without_previous_version_is_not_loaded(hook_dir: Path) -> None:
    registry = HookRegistry(hook_dir)
    write(hook_dir, "hook.json", "{")
    result = registry.reload()
    assert result.kept == () and "hook.json" in result.rejected
    assert len(registry.snapshot) == 0


# --------------------------------------------------------------------------- watcher


class Observer:
    """Collects registry snapshots and hook-config log events, and lets tests await them."""

    def __init__(self, registry: HookRegistry) -> None:
        self.registry = registry
        self._cond = asyncio.Condition()
        self.events: list[tuple[str, str]] = []  # (hook_event, hook_file) from the log
        registry.on_change(self._on_change)
        self._handler = _CallbackHandler(self._on_record)
        logging.getLogger(LOGGER).addHandler(self._handler)

    def close(self) -> None:
        logging.getLogger(LOGGER).removeHandler(self._handler)

    def _notify(self) -> None:
        # Callbacks run in the event-loop thread (watch() reloads there).
        async def notify() -> None:
            async with self._cond:
                self._cond.notify_all()

        asyncio.get_running_loop().create_task(notify())

    def _on_change(self, snapshot: HookSnapshot) -> None:
        self._notify()

    def _on_record(self, record: logging.LogRecord) -> None:
        event = getattr(record, "hook_event", None)
        if event:
            self.events.append((event, record.hook_file))  # type: ignore[attr-defined]
            self._notify()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> float:
        """Await predicate() becoming true; returns the time it took."""
        start = time.monotonic()
        async with asyncio.timeout(timeout):
            async with self._cond:
                await self._cond.wait_for(predicate)
        return time.monotonic() - start


class _CallbackHandler(logging.Handler):
    def __init__(self, callback: Callable[[logging.LogRecord], None]) -> None:
        super().__init__(level=logging.DEBUG)
        self._callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        self._callback(record)


def endpoint_of(registry: HookRegistry, name: str) -> str | None:
    cfg = registry.snapshot.servers.get(name)
    return cfg.endpoint if cfg else None


@pytest.fixture
async def watched(hook_dir: Path) -> AsyncIterator[tuple[HookRegistry, Observer]]:
    """A registry watching hook_dir, with the watcher proven live by a probe file."""
    logging.getLogger(LOGGER).setLevel(logging.DEBUG)
    registry = HookRegistry(hook_dir)
    observer = Observer(registry)
    stop = asyncio.Event()
    task = asyncio.create_task(registry.watch(stop))
    # Warm-up: the first change may land before the inotify watch is registered
    # and then only be caught by the periodic resync; wait for it generously.
    write(hook_dir, "zz-probe.json", valid_doc("/run/probe.sock"))
    await observer.wait_for(lambda: "zz-probe.json" in registry.snapshot.servers, timeout=10)
    (hook_dir / "zz-probe.json").unlink()
    await observer.wait_for(lambda: "zz-probe.json" not in registry.snapshot.servers, timeout=10)
    try:
        yield registry, observer
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        observer.close()
        logging.getLogger(LOGGER).setLevel(logging.NOTSET)


async def test_watch_live_add_change_delete(hook_dir: Path, watched: tuple[HookRegistry, Observer]) -> None:
    registry, observer = watched

    write(hook_dir, "live.json", valid_doc("/run/v1.sock"))
    took = await observer.wait_for(lambda: endpoint_of(registry, "live.json") == "/run/v1.sock")
    assert took < 1.0, f"add took {took:.2f}s"

    # Edit in place (not an atomic rename) like an operator with an editor.
    (hook_dir / "live.json").write_text(json.dumps(valid_doc("/run/v2.sock", priority=3)))
    took = await observer.wait_for(lambda: endpoint_of(registry, "live.json") == "/run/v2.sock")
    assert took < 1.0, f"change took {took:.2f}s"
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER)[0].priority == 3

    (hook_dir / "live.json").unlink()
    took = await observer.wait_for(lambda: "live.json" not in registry.snapshot.servers)
    assert took < 1.0, f"delete took {took:.2f}s"
    assert registry.servers_for(HookType.PRE_CREATE_CONTAINER) == ()


async def test_watch_broken_edit_keeps_last_good(hook_dir: Path, watched: tuple[HookRegistry, Observer]) -> None:
    registry, observer = watched
    write(hook_dir, "hook.json", valid_doc("/run/good.sock"))
    await observer.wait_for(lambda: endpoint_of(registry, "hook.json") == "/run/good.sock")

    write(hook_dir, "hook.json", valid_doc("/run/bad.sock", **{"failure-policy": "Sometimes"}))
    took = await observer.wait_for(lambda: ("rejected", "hook.json") in observer.events)
    assert took < 1.0
    assert endpoint_of(registry, "hook.json") == "/run/good.sock"

    write(hook_dir, "hook.json", valid_doc("/run/fixed.sock"))
    took = await observer.wait_for(lambda: endpoint_of(registry, "hook.json") == "/run/fixed.sock")
    assert took < 1.0


async def test_watch_waits_for_missing_directory(tmp_path: Path) -> None:
    hook_dir = tmp_path / "later" / "hookserver.d"
    registry = HookRegistry(hook_dir)
    observer = Observer(registry)
    stop = asyncio.Event()
    task = asyncio.create_task(registry.watch(stop))
    try:
        hook_dir.mkdir(parents=True)
        os.chmod(hook_dir, 0o755)
        write(hook_dir, "hook.json", valid_doc())
        await observer.wait_for(lambda: "hook.json" in registry.snapshot.servers)

        # Directory removed and re-created: the watcher follows the new directory.
        (hook_dir / "hook.json").unlink()
        hook_dir.rmdir()
        await observer.wait_for(lambda: len(registry.snapshot) == 0)
        hook_dir.mkdir()
        os.chmod(hook_dir, 0o755)
        write(hook_dir, "again.json", valid_doc("/run/again.sock"))
        await observer.wait_for(lambda: "again.json" in registry.snapshot.servers)
        assert not task.done()
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        observer.close()


async def test_watch_stops_promptly_and_survives_unusable_directory(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    registry = HookRegistry(not_a_dir)
    stop = asyncio.Event()
    task = asyncio.create_task(registry.watch(stop))
    await asyncio.sleep(0)  # let it start; nothing to await on an unusable directory
    assert not task.done()
    stop.set()
    await asyncio.wait_for(task, 2)
    assert task.exception() is None


async def test_watch_can_be_cancelled(hook_dir: Path) -> None:
    registry = HookRegistry(hook_dir)
    task = asyncio.create_task(registry.watch(asyncio.Event()))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
