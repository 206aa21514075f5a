"""A hook file's keys read as koord-runtime-proxy's Go decoder reads them
(hookkeys.py): Koordinator's in any case, the last of a key given twice
counting, a null leaving an earlier string as it was; each with a warning
naming the key as written and the key it is read as. Ours as written only."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from runtimeproxy.hookpath.hookfile import Answers, FailurePolicy, HookConfigError, parse_hook_file
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.registry import HookRegistry

from .registrydir import make_hook_dir, write

REGISTRY_LOGGER = "runtimeproxy.hookpath.registry"


@pytest.fixture
def hook_dir(tmp_path: Path) -> Path:
    return make_hook_dir(tmp_path)


def test_koordinators_keys_are_read_in_any_case_with_a_note_naming_both_spellings(hook_dir: Path) -> None:
    """`"Remote-Endpoint"` works with koord-runtime-proxy; here the file was refused (`missing "remote-endpoint"`)."""
    path = write(hook_dir, "koord.json", (
        '{"Remote-Endpoint": "/run/k.sock", "FAILURE-POLICY": "Fail", "Runtime-Hooks": ["PreCreateContainer"],'
        ' "remote-endpoint-x": 1}'
    ))
    config = parse_hook_file(path)
    assert (config.endpoint, config.failure_policy, config.hooks) == ("/run/k.sock", FailurePolicy.FAIL,
                                                                      frozenset({HookType.PRE_CREATE_CONTAINER}))
    assert [(n.written, n.key, n.read) for n in config.key_notes] == [
        ("Remote-Endpoint", "remote-endpoint", True), ("FAILURE-POLICY", "failure-policy", True),
        ("Runtime-Hooks", "runtime-hooks", True),
    ]
    assert str(config.key_notes[0]) == ('key "Remote-Endpoint" read as "remote-endpoint" '
                                         "(koord-runtime-proxy reads keys in any case)")


@pytest.mark.parametrize(("text", "meant"), [
    ('"Timeout": "bad"', "timeout"),  # refused the file, which loads on main (an unknown key there)
    ('"Answers": "whole"', "answers"),  # turned on cpuset clearing
    ('"PRIORITY": 7', "priority"),
])
def test_a_key_of_ours_in_another_case_is_ignored_naming_the_key_it_may_mean(
    hook_dir: Path, text: str, meant: str
) -> None:
    """koord-runtime-proxy's decoder never reads our keys (no field of its struct):
    they were folded too, so that `"Timeout": "bad"` refused a file that loads on main."""
    path = write(hook_dir, "ours.json", '{"remote-endpoint": "/run/a.sock", ' + text + "}")
    config = parse_hook_file(path)
    assert (config.timeout, config.priority, config.answers) == (2.0, 0, Answers.CHANGES)
    (note,) = config.key_notes
    written = text.split('"')[1]
    assert (note.written, note.key, note.read) == (written, meant, False)
    assert str(note) == (f'key "{written}" ignored: did you mean \'{meant}\'? (keys of ours are read as written; '
                         "only Koordinator's are read in any case)")


def test_the_keys_as_we_write_them_carry_no_note(hook_dir: Path) -> None:
    path = write(hook_dir, "h.json", '{"remote-endpoint": "/run/h.sock", "timeout": "1s"}')
    assert parse_hook_file(path).key_notes == ()


@pytest.mark.parametrize(("text", "endpoint"), [
    ('{"remote-endpoint": "/run/a.sock", "Remote-Endpoint": "/run/b.sock"}', "/run/b.sock"),
    ('{"Remote-Endpoint": "/run/a.sock", "remote-endpoint": "/run/b.sock"}', "/run/b.sock"),  # no exact-match preference
    ('{"remote-endpoint": "/run/a.sock", "remote-endpoint": "/run/b.sock"}', "/run/b.sock"),  # the same spelling too
])
def test_a_key_given_twice_in_any_case_counts_its_last_value(hook_dir: Path, text: str, endpoint: str) -> None:
    """As Go's encoding/json: each key is stored as it comes, so the last one in the file wins
    (golang/go#43664): "preferring an exact match" picks between struct fields, not between keys."""
    config = parse_hook_file(write(hook_dir, "twice.json", text))
    assert config.endpoint == endpoint
    twice = [str(n) for n in config.key_notes if "given twice" in str(n)]
    assert twice == [f'"remote-endpoint" given twice ("{text[2:17]}": \'/run/a.sock\', then "{text[36:51]}": '
                     "'/run/b.sock'): the last one counts, as in koord-runtime-proxy"]


def test_a_later_null_leaves_an_earlier_string_and_empties_a_list(hook_dir: Path) -> None:
    """Go leaves a string field as it was on a null, and sets a slice to nil."""
    path = write(hook_dir, "nulls.json", (
        '{"remote-endpoint": "/run/a.sock", "failure-policy": "Fail", "Failure-Policy": null,'
        ' "runtime-hooks": ["PreCreateContainer"], "Runtime-Hooks": null}'
    ))
    config = parse_hook_file(path)
    assert config.failure_policy is FailurePolicy.FAIL and config.hooks == frozenset()
    assert ('"failure-policy" given twice ("failure-policy", then "Failure-Policy": null): the null changes nothing, '
            "as in koord-runtime-proxy; 'Fail' stands") in [str(n) for n in config.key_notes]


@pytest.mark.parametrize(("text", "note"), [
    ('"runtime-hooks": ["PreCreateContainer"], "Runtime-Hooks": null',
     "\"runtime-hooks\" given twice (\"runtime-hooks\": ['PreCreateContainer'], then \"Runtime-Hooks\": null)"),
    ('"runtime-hooks": null, "Runtime-Hooks": ["PreCreateContainer"]',
     "\"runtime-hooks\" given twice (\"runtime-hooks\": null, then \"Runtime-Hooks\": ['PreCreateContainer'])"),
])
def test_a_null_given_twice_is_shown_as_json_writes_it(hook_dir: Path, text: str, note: str) -> None:
    """The note said `then "Runtime-Hooks": None`, Python's word, in a JSON file's warning."""
    config = parse_hook_file(write(hook_dir, "n.json", '{"remote-endpoint": "/run/a.sock", ' + text + "}"))
    assert [str(n) for n in config.key_notes if "given twice" in str(n)] == [
        f"{note}: the last one counts, as in koord-runtime-proxy"]


def test_a_key_given_twice_with_the_same_value_notes_only_its_spelling(hook_dir: Path) -> None:
    path = write(hook_dir, "same.json", '{"remote-endpoint": "/run/a.sock", "Remote-Endpoint": "/run/a.sock"}')
    assert [str(n) for n in parse_hook_file(path).key_notes] == [
        'key "Remote-Endpoint" read as "remote-endpoint" (koord-runtime-proxy reads keys in any case)'
    ]


def test_keys_fold_as_go_folds_them(hook_dir: Path) -> None:
    """Go folds the Kelvin sign to k and the long s to s, and no other rune to an ASCII letter."""
    path = write(hook_dir, "runes.json", {"remote-endpoint": "/run/a.sock", "runtime-hoo\u212a\u017f": ["PreStartContainer"],
                                          "pr\u0131ority": 5, "\u0130nvalid": 1})
    config = parse_hook_file(path)
    assert config.hooks == frozenset({HookType.PRE_START_CONTAINER})
    assert config.priority == 0  # dotless i is no i to Go: an unknown key, ignored
    assert [n.key for n in config.key_notes] == ["runtime-hooks"]
    misspelt = parse_hook_file(write(hook_dir, "ours.json", {"remote-endpoint": "/run/a.sock", "an\u017fwers": "whole"}))
    assert misspelt.answers is Answers.CHANGES and [(n.key, n.read) for n in misspelt.key_notes] == [("answers", False)]


def test_a_bad_value_under_another_spelling_is_refused_naming_the_key(hook_dir: Path) -> None:
    path = write(hook_dir, "bad.json", '{"remote-endpoint": "/run/a.sock", "FAILURE-POLICY": 5}')
    with pytest.raises(HookConfigError) as err:
        parse_hook_file(path)
    assert err.value.reason == '"failure-policy" must be a string, got number'


@pytest.mark.parametrize("policy", ["fail", "FAIL", "ignore"])
def test_a_failure_policy_value_is_not_read_in_any_case(hook_dir: Path, policy: str) -> None:
    """Keys match in any case; values do not: an unknown policy stays refused, so that a
    file meaning Fail does not pass for Ignore in silence."""
    path = write(hook_dir, "p.json", {"remote-endpoint": "/run/a.sock", "Failure-Policy": policy})
    with pytest.raises(HookConfigError) as err:
        parse_hook_file(path)
    assert err.value.reason == f"unknown \"failure-policy\" '{policy}' (allowed: 'Fail', 'Ignore')"


def test_the_registry_warns_once_per_version_naming_file_key_and_its_reading(
    hook_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=REGISTRY_LOGGER)
    write(hook_dir, "koord.json", '{"Remote-Endpoint": "/run/k.sock", "runtime-hooks": ["PreCreateContainer"]}')
    registry = HookRegistry(hook_dir)
    assert registry.reload().added == ("koord.json",)
    registry.reload()
    registry.rescan(["koord.json"])  # read again, unchanged: no new warning
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.getMessage() == ('hook config koord.json: key "Remote-Endpoint" read as "remote-endpoint" '
                                   "(koord-runtime-proxy reads keys in any case)")
    assert (record.hook_file, record.hook_key, record.hook_key_read_as) == ("koord.json", "Remote-Endpoint",  # type: ignore[attr-defined]
                                                                            "remote-endpoint")
    write(hook_dir, "koord.json", '{"REMOTE-ENDPOINT": "/run/k.sock", "runtime-hooks": ["PreCreateContainer"]}')
    result = registry.rescan(["koord.json"])
    assert not result.modified  # the same registration, spelt otherwise: warned again, not "changed"
    assert [r.hook_key for r in caplog.records if r.levelno == logging.WARNING] == [  # type: ignore[attr-defined]
        "Remote-Endpoint", "REMOTE-ENDPOINT"]


def test_the_registry_warns_of_a_key_of_ours_in_another_case_naming_the_key_meant(
    hook_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=REGISTRY_LOGGER)
    write(hook_dir, "ours.json", '{"remote-endpoint": "/run/a.sock", "runtime-hooks": ["PreCreateContainer"], "Timeout": "bad"}')
    assert HookRegistry(hook_dir).reload().added == ("ours.json",)
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.getMessage().startswith("hook config ours.json: key \"Timeout\" ignored: did you mean 'timeout'? ")
    assert (record.hook_key, record.hook_key_meant) == ("Timeout", "timeout")  # type: ignore[attr-defined]
    assert not hasattr(record, "hook_key_read_as")


@pytest.mark.parametrize(("first", "problem"), [
    ('"remote-endpoint": 5', '"remote-endpoint" must be a string, got number ("remote-endpoint": 5'),
    ('"Remote-Endpoint": ["/run/b.sock"]', '"remote-endpoint" must be a string, got array ("Remote-Endpoint": [\'/run/b.sock\']'),
    ('"failure-policy": true', '"failure-policy" must be a string, got boolean ("failure-policy": true,'),
    ('"runtime-hooks": "PreCreateContainer"', '"runtime-hooks" must be a list of hook names, got string'),
    ('"runtime-hooks": ["PreCreateContainer", 5]', '"runtime-hooks" entries must be strings, got number'),
])
def test_a_koordinator_key_of_the_wrong_type_refuses_the_file_though_a_later_value_is_good(
    hook_dir: Path, first: str, problem: str
) -> None:
    """Go's decoder records an UnmarshalTypeError and goes on; Unmarshal returns it and
    koord-runtime-proxy refuses the file. Here the last value counted, and the file loaded."""
    path = write(hook_dir, "typed.json", "{" + first + ', "remote-endpoint": "/run/a.sock", "failure-policy": "Fail",'
                 ' "runtime-hooks": ["PreCreateContainer"]}')
    with pytest.raises(HookConfigError) as err:
        parse_hook_file(path)
    (reason,) = err.value.problems
    assert reason.startswith(problem)
    assert reason.endswith("overridden by a later value: koord-runtime-proxy refuses the file for it all the same)")
    assert not [n for n in parse_hook_document_notes(path) if "given twice" in str(n)]  # no "the last one counts"


def parse_hook_document_notes(path: Path) -> tuple[object, ...]:
    import json

    from runtimeproxy.hookpath.hookfile import KNOWN_KEYS
    from runtimeproxy.hookpath.hookkeys import match_keys, object_pairs

    return match_keys(json.loads(path.read_text(), object_pairs_hook=object_pairs), KNOWN_KEYS).notes


@pytest.mark.parametrize("text", [
    '{"remote-endpoint": "/run/a.sock", "remote-endpoint": 5}',  # the value that counts: its own check, once
    '{"remote-endpoint": 5, "remote-endpoint": null}',  # the null changes nothing: 5 counts
])
def test_a_key_whose_counting_value_is_of_the_wrong_type_is_refused_once(hook_dir: Path, text: str) -> None:
    with pytest.raises(HookConfigError) as err:
        parse_hook_file(write(hook_dir, "typed.json", text))
    assert err.value.problems == ('"remote-endpoint" must be a string, got number',)


def test_a_null_or_a_key_of_ours_before_the_value_that_counts_is_no_type_error(hook_dir: Path) -> None:
    path = write(hook_dir, "nulls.json", '{"remote-endpoint": null, "runtime-hooks": null, "timeout": 5, '
                 '"remote-endpoint": "/run/a.sock", "runtime-hooks": ["PreCreateContainer"], "timeout": "1s"}')
    config = parse_hook_file(path)
    assert (config.endpoint, config.timeout) == ("/run/a.sock", 1.0)


def test_a_change_of_key_notes_alone_logs_only_the_new_note(hook_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A key spelt otherwise logged the file's other warnings again (hook points never
    called, "registers no runtime hooks"), though nothing of them had changed."""
    caplog.set_level(logging.WARNING, logger=REGISTRY_LOGGER)
    write(hook_dir, "k.json", '{"Remote-Endpoint": "/run/k.sock", "runtime-hooks": ["PreRemoveRunPodSandbox"]}')
    registry = HookRegistry(hook_dir)
    registry.reload()
    first = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(first) == 3 and "registers no runtime hooks" in first[2]
    caplog.clear()
    write(hook_dir, "k.json", '{"REMOTE-ENDPOINT": "/run/k.sock", "runtime-hooks": ["PreRemoveRunPodSandbox"]}')
    registry.rescan(["k.json"])
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        'hook config k.json: key "REMOTE-ENDPOINT" read as "remote-endpoint" (koord-runtime-proxy reads keys in any case)']
    caplog.clear()
    registry.rescan()  # the periodic rescan: the version just warned of is the one in force, warned of again at none
    registry.reload()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == []
    write(hook_dir, "k.json", '{"REMOTE-ENDPOINT": "/run/k.sock", "runtime-hooks": ["PreRemoveRunPodSandbox", "PreStartContainer"]}')
    registry.rescan(["k.json"])  # registers a hook now: nothing new to warn of
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == []
