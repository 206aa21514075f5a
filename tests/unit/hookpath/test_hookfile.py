"""Tests of runtimeproxy.hookpath.hookfile: the hook-file format (durations, parsing, permission safety).

Real files in tmp_path.  The registry that reads a directory of them is tested
in test_registry_*.py.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from runtimeproxy.hookpath.hookfile import (
    DEFAULT_PRIORITY,
    DEFAULT_TIMEOUT,
    Answers,
    FailurePolicy,
    HookConfigError,
    HookServerConfig,
    format_duration,
    parse_duration,
    parse_hook_file,
)
from runtimeproxy.hookpath.points import HookType

from ...prerequisites import fail_or_skip
from .registrydir import make_hook_dir, valid_doc, write

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


@pytest.fixture
def hook_dir(tmp_path: Path) -> Path:
    return make_hook_dir(tmp_path)


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
        answers=Answers.WHOLE,  # koordlet.json: as koord-runtime-proxy read koordlet's answers
        owner_uid=os.stat(path).st_uid,  # kept to check its endpoint's owner at call time
    )
    assert cfg.timeout == 2.0 and cfg.priority == 0


# koordlet's Register(): json.MarshalIndent(config, "", "\t") of every stage
# with hooks (map order), and with every stage disabled (omitempty drops the list).
KOORDLET_BYTES = (
    '{\n\t"remote-endpoint": "/var/run/koordlet/koordlet.sock",\n\t"failure-policy": "Ignore",\n'
    '\t"runtime-hooks": [\n\t\t"PreUpdateContainerResources",\n\t\t"PreRemoveRunPodSandbox",\n'
    '\t\t"PreRunPodSandbox",\n\t\t"PreCreateContainer",\n\t\t"PostStopPodSandbox",\n'
    '\t\t"PreStartContainer",\n\t\t"PostStartContainer",\n\t\t"PostStopContainer"\n\t]\n}'
)
KOORDLET_NO_STAGES = '{\n\t"remote-endpoint": "/var/run/koordlet//koordlet.sock",\n\t"failure-policy": "Fail"\n}'


def test_koordlets_own_bytes_load(hook_dir: Path) -> None:
    every = parse_hook_file(write(hook_dir, "koordlet.json", KOORDLET_BYTES))
    assert (every.endpoint, every.failure_policy, every.hooks) == (
        "/var/run/koordlet/koordlet.sock", FailurePolicy.IGNORE, frozenset(HookType)
    )
    assert every.uncalled_hooks == frozenset({"PreRemoveRunPodSandbox"})
    none = parse_hook_file(write(hook_dir, "koordlet.json", KOORDLET_NO_STAGES))
    assert (none.endpoint, none.failure_policy, none.hooks) == (
        "/var/run/koordlet//koordlet.sock", FailurePolicy.FAIL, frozenset()
    )


def test_all_seven_hook_names_and_optional_keys(hook_dir: Path) -> None:
    doc = valid_doc(timeout="1.5s", priority=-3)
    doc["runtime-hooks"] = [h.value for h in HookType]
    cfg = parse_hook_file(write(hook_dir, "all.json", doc))
    assert cfg.hooks == frozenset(HookType)
    assert len(HookType) == 7
    assert cfg.failure_policy is FailurePolicy.FAIL
    assert cfg.timeout == 1.5
    assert cfg.priority == -3


def test_answers_default_to_changes_and_to_whole_for_koordlet_json(hook_dir: Path) -> None:
    assert parse_hook_file(write(hook_dir, "lean.json", valid_doc())).answers is Answers.CHANGES
    assert parse_hook_file(write(hook_dir, "koordlet.json", valid_doc())).answers is Answers.WHOLE
    # The file's key wins, either way.
    assert parse_hook_file(write(hook_dir, "lean.json", valid_doc(answers="whole"))).answers is Answers.WHOLE
    assert parse_hook_file(write(hook_dir, "koordlet.json", valid_doc(answers="changes"))).answers is Answers.CHANGES
    # Only that exact name: a copy or a differently named koordlet file says so itself.
    assert parse_hook_file(write(hook_dir, "koordlet-2.json", valid_doc())).answers is Answers.CHANGES
    cfg = parse_hook_file(write(hook_dir, "koordlet.json", valid_doc()))
    assert "answers=whole" in cfg.describe() and cfg.log_fields()["hook_answers"] == "whole"


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


def test_koordlets_never_called_hook_point_is_accepted_and_ignored(hook_dir: Path) -> None:
    """koordlet lists PreRemoveRunPodSandbox, which koord-runtime-proxy never
    calls: its file still registers its other hook points."""
    doc = valid_doc(**{"runtime-hooks": ["PreRunPodSandbox", "PreRemoveRunPodSandbox", "PreCreateContainer"]})
    config = parse_hook_file(write(hook_dir, "koordlet.json", doc))
    assert config.hooks == frozenset({HookType.PRE_RUN_POD_SANDBOX, HookType.PRE_CREATE_CONTAINER})
    assert config.uncalled_hooks == frozenset({"PreRemoveRunPodSandbox"})


def test_duplicate_hook_names_are_collapsed(hook_dir: Path) -> None:
    doc = valid_doc()
    doc["runtime-hooks"] = ["PreCreateContainer", "PreCreateContainer"]
    assert parse_hook_file(write(hook_dir, "d.json", doc)).hooks == frozenset({HookType.PRE_CREATE_CONTAINER})


INVALID_CASES: dict[str, tuple[object, str]] = {
    "bad-json.json": ('{"remote-endpoint": "/run/x.sock",', "invalid JSON"),
    "empty.json": ("", "file is empty"),
    "array.json": ([valid_doc()], "must be an object, got array"),
    "string.json": ('"hello"', "must be an object, got string"),
    "unknown-hook.json": (valid_doc(**{"runtime-hooks": ["PreCreateContainer", "PreStopContainer"]}), "unknown runtime hook 'PreStopContainer'"),
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
    "answers-unknown.json": (valid_doc(answers="all"), "unknown \"answers\" 'all' (allowed: 'changes', 'whole')"),
    "answers-case.json": (valid_doc(answers="Whole"), "unknown \"answers\" 'Whole'"),
    "answers-bool.json": (valid_doc(answers=True), '"answers" must be a string, got boolean'),
    "answers-null.json": (valid_doc(answers=None), '"answers" must be a string, got null'),
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


HUGE = "x" * 900_000  # a hook file may be 1 MiB: each reason quoting a value must stay short (status sends them all)


@pytest.mark.parametrize("doc", [
    valid_doc(endpoint="run/" + HUGE),
    valid_doc(endpoint="/run/" + HUGE + "\udc80"),
    valid_doc(**{"failure-policy": HUGE}),
    valid_doc(**{"runtime-hooks": [HUGE]}),
    valid_doc(priority=[HUGE[:300_000]] * 3),
], ids=["relative-endpoint", "surrogate-endpoint", "policy", "hook", "priority"])
def test_a_huge_value_is_shown_cut_short_in_the_reason(hook_dir: Path, doc: dict[str, object]) -> None:
    """A 900 kB "remote-endpoint" gave a 900,057-character reason, sent whole by `status`."""
    with pytest.raises(HookConfigError) as excinfo:
        parse_hook_file(write(hook_dir, "huge.json", doc))
    assert len(excinfo.value.reason) < 400, excinfo.value.reason[:200]
    assert "..." in excinfo.value.reason


def test_non_utf8_rejected(hook_dir: Path) -> None:
    path = hook_dir / "latin1.json"
    path.write_bytes(b'{"remote-endpoint": "/run/\xe9.sock"}')
    os.chmod(path, 0o644)
    with pytest.raises(HookConfigError, match="latin1.json.*not valid UTF-8"):
        parse_hook_file(path)


def test_longest_socket_path_is_accepted(hook_dir: Path) -> None:
    endpoint = "/run/" + "a" * 102
    assert parse_hook_file(write(hook_dir, "long.json", valid_doc(endpoint))).endpoint == endpoint


# --------------------------------------------------------------------------- permission safety


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666, 0o620, 0o602])
def test_group_or_other_writable_file_refused(hook_dir: Path, mode: int) -> None:
    path = write(hook_dir, "loose.json", valid_doc(), mode=mode)
    with pytest.raises(HookConfigError, match=r"loose\.json.*refused.*writable by") as excinfo:
        parse_hook_file(path)
    assert f"{mode:04o}" in excinfo.value.reason


def test_permission_check_can_be_disabled(hook_dir: Path) -> None:
    path = write(hook_dir, "loose.json", valid_doc(), mode=0o666)
    assert parse_hook_file(path, check_permissions=False).name == "loose.json"


def test_file_not_owned_by_root_refused(hook_dir: Path) -> None:
    if os.geteuid() != 0:
        fail_or_skip("needs root to chown (CI runs as root)")
    path = write(hook_dir, "foreign.json", valid_doc())
    os.chown(path, 12345, 12345)
    with pytest.raises(HookConfigError, match=r"foreign\.json.*owned by uid 12345"):
        parse_hook_file(path)


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


def test_fifo_rejected_without_blocking(hook_dir: Path) -> None:
    os.mkfifo(hook_dir / "fifo.json", 0o644)
    with pytest.raises(HookConfigError, match="not a regular file"):
        parse_hook_file(hook_dir / "fifo.json")
