"""Config parsing: every key, NRI keys this hook does not implement, typos, bad values."""

from __future__ import annotations

import subprocess
import sys
from functools import partial

import pytest
import yaml

from hooks.balloons.config import (
    DEFAULT,
    RESERVED,
    ConfigError,
    PodContext,
    load_config_file,
    parse_config,
)
from hooks.balloons.planning import choose_type

from ..test_config_mistakes import LAUGHS_SHOWN, inline_laughs

FULL = """
reservedResources:
  cpu: cpuset:0-1
availableResources:
  cpu: cpuset:0-15
reservedPoolNamespaces: [kube-system, "monitoring-*"]
pinCPU: true
pinMemory: false
runtimeEndpoint: unix:///run/proxy.sock
onExhausted: Ignore
stateDir: /var/lib/runtime-proxy/balloons
balloonTypes:
  - name: latency
    namespaces: [rt-*]
    minCPUs: 2
    maxCPUs: 4
    minBalloons: 1
    maxBalloons: 3
    preferNewBalloons: true
    shareIdleCPUsInSame: numa
  - name: batch
    matchExpressions:
      - {key: pod/labels/tier, operator: In, values: [batch, bulk]}
      - {key: name, operator: Matches, values: ["work*"]}
"""


def test_every_key_is_read(tmp_path) -> None:
    path = tmp_path / "balloons.yaml"
    path.write_text(FULL)
    config = load_config_file(path)
    assert config.reserved_cpuset == set(range(2)) and config.reserved_milli == 0
    assert config.available_cpuset == set(range(16))
    assert config.reserved_pool_namespaces == ("kube-system", "monitoring-*")
    assert config.pin_cpu and not config.pin_memory
    assert config.runtime_endpoint == "/run/proxy.sock"
    assert config.on_exhausted == "Ignore"
    assert config.state_dir == "/var/lib/runtime-proxy/balloons"
    latency, batch = config.balloon_types
    assert (latency.name, latency.namespaces, latency.min_cpus, latency.max_cpus) == ("latency", ("rt-*",), 2, 4)
    assert (latency.min_balloons, latency.max_balloons, latency.prefer_new_balloons) == (1, 3, True)
    assert latency.share_idle_cpus_in_same == "numa"
    assert [(e.key, e.operator, e.values) for e in batch.match_expressions] == [
        ("pod/labels/tier", "In", ("batch", "bulk")), ("name", "Matches", ("work*",))]
    assert (batch.name, batch.namespaces, batch.min_cpus, batch.max_cpus, batch.share_idle_cpus_in_same) == (
        "batch", (), 0, 0, "")
    assert [t.name for t in config.all_types] == ["latency", "batch", RESERVED, DEFAULT]
    assert config.warnings == ()

    choose = partial(choose_type, config)
    assert choose(PodContext("rt-audio", "mixer-1", "mixer", {"tier": "batch"})).name == "latency"
    assert choose(PodContext("x", "p", "mixer", {"tier": "batch"})).name == "default"  # container name is not work*
    assert choose(PodContext("x", "p", "worker", {"tier": "bulk"})).name == "batch"
    assert choose(PodContext("x", "p", "worker", {"tier": "web"})).name == "default"
    assert choose(PodContext("monitoring-a", "p", "worker", {"tier": "bulk"})).name == "reserved"


def test_defaults_and_quantities() -> None:
    config = parse_config({"reservedResources": {"cpu": "1500m"}})
    assert config.reserved_cpuset is None and config.reserved_milli == 1500
    assert config.reserved_pool_namespaces == ("kube-system",)
    assert config.on_exhausted == "Fail" and config.pin_cpu and config.pin_memory
    assert config.state_dir == ""  # not saved: a restart deduces the reserved CPUs
    # "stateDir:" left empty in YAML is null: off too (before: a config error).
    assert parse_config(yaml.safe_load("reservedResources: {cpu: 1}\nstateDir:\n")).state_dir == ""
    assert parse_config({"reservedResources": {"cpu": 2}}).reserved_milli == 2000
    assert parse_config({"reservedResources": {"cpu": "0.5"}}).reserved_milli == 500


def test_a_config_differing_in_its_state_dir_plans_as_the_same() -> None:
    """A reload that moves stateDir changes no balloon (it is where the
    reserved CPUs are saved, not how containers are placed)."""
    doc = {"reservedResources": {"cpu": "1"}, "balloonTypes": [{"name": "a"}]}
    config = parse_config({**doc, "stateDir": "/var/lib/runtime-proxy/balloons"})
    assert config.plans_as(parse_config(doc)) and config.plans_as(parse_config({**doc, "stateDir": "/elsewhere"}))
    assert not config.plans_as(parse_config({**doc, "reservedResources": {"cpu": "2"}}))


def test_a_balloons_policy_resource_is_read_from_its_spec() -> None:
    doc = {"apiVersion": "config.nri/v1alpha1", "kind": "BalloonsPolicy", "metadata": {"name": "default"},
           "spec": {"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "a"}]}}
    assert parse_config(doc).balloon_types[0].name == "a"


def test_nri_keys_this_hook_does_not_implement_are_reported() -> None:
    config = parse_config({
        "reservedResources": {"cpu": "cpuset:0"},
        "allocatorTopologyBalancing": True,
        "balloonTypes": [{"name": "a", "cpuClass": "turbo"}],
    })
    assert any("allocatorTopologyBalancing" in w for w in config.warnings)
    assert any("balloonTypes[0].cpuClass" in w for w in config.warnings)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({}, "reservedResources.cpu: required"),
        ({"reservedResources": {"cpu": "cpuset:0"}, "balloonType": []}, "unknown key 'balloonType' (did you mean 'balloonTypes'?)"),
        ({"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "a", "maxCpus": 2}]}, "did you mean 'maxCPUs'"),
        ({"reservedResources": {"cpu": "cpuset:0", "memory": "1G"}}, "reservedResources: unknown key 'memory'"),
        ({"reservedResources": {"cpu": "lots"}}, "reservedResources.cpu: expected"),
        ({"reservedResources": {"cpu": "cpuset:3-1"}}, "bad cpuset"),
        ({"reservedResources": {"cpu": "-1"}}, "positive CPU quantity"),
        ({"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "a", "minCPUs": -1}]}, "minCPUs: expected a whole number"),
        ({"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "a", "minCPUs": 4, "maxCPUs": 2}]}, "minCPUs 4 is more than maxCPUs 2"),
        ({"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "a", "minBalloons": 3, "maxBalloons": 1}]}, "minBalloons 3 is more than maxBalloons 1"),
        ({"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "a"}, {"name": "a"}]}, "used twice"),
        ({"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "a", "shareIdleCPUsInSame": "l2cache"}]}, "not supported"),
        ({"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "a", "preferNewBalloons": "yes"}]}, "expected true or false"),
        ({"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"namespaces": ["x"]}]}, "name: required"),
        ({"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "a", "matchExpressions": [{"key": "k", "operator": "Like"}]}]}, "operator: 'Like' is not one of"),
        ({"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "a", "matchExpressions": [{"key": "k", "operator": "In"}]}]}, "needs at least one value"),
        ({"reservedResources": {"cpu": "cpuset:0"}, "onExhausted": "Maybe"}, "onExhausted: expected Fail or Ignore"),
        ({"reservedResources": {"cpu": "cpuset:4"}, "availableResources": {"cpu": "cpuset:0-3"}}, "must be among availableResources"),
        ([1, 2], "expected a mapping"),
        ({"reservedResources": {"cpu": "1"}, "stateDir": "state"}, "stateDir: expected an absolute directory path"),
        ({"reservedResources": {"cpu": "1"}, "stateDir": ["/x"]}, "stateDir: expected an absolute directory path"),
        ({"reservedResources": {"cpu": "1"}, "stateDir": "/x\0y"}, "stateDir: expected an absolute directory path"),
    ],
)
def test_bad_configs_name_the_key(doc, message) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert message in str(info.value)


def test_bad_yaml_names_the_file(tmp_path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text("reservedResources: [\n")
    with pytest.raises(ConfigError, match="b.yaml: not valid YAML"):
        load_config_file(path)


# As hook run's start reads the file (hooks/cli.py): a reload that took what
# the next start refuses would leave the hook down after a reboot.
def test_a_key_given_twice_with_different_values_is_refused_on_reload(tmp_path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text("reservedResources:\n  cpu: cpuset:0\n  cpu: cpuset:1\n")
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert str(info.value) == (
        f"{path}: 'reservedResources.cpu' is set twice (lines 2 and 3), to different values (YAML keeps the last); keep one"
    )


def test_a_key_given_twice_with_the_same_value_is_a_warning_on_reload(tmp_path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text("reservedResources:\n  cpu: cpuset:0\n  cpu: cpuset:0\n")
    config = load_config_file(path)
    assert config.reserved_cpuset == {0}
    assert config.warnings[0] == "'reservedResources.cpu' is set twice (lines 2 and 3), to the same value; keep one"


# A ConfigMap's config, reloaded in the hook's event loop: each value it refuses shown cut short.
LAUGHS = {
    "reservedResources.cpu": "reservedResources: {{cpu: {}}}",
    "availableResources.cpu": "reservedResources: {{cpu: 1}}\navailableResources: {{cpu: {}}}",
    "reservedPoolNamespaces": "reservedResources: {{cpu: 1}}\nreservedPoolNamespaces: {}",
    "pinCPU": "reservedResources: {{cpu: 1}}\npinCPU: {}",
    "runtimeEndpoint": "reservedResources: {{cpu: 1}}\nruntimeEndpoint: {}",
    "onExhausted": "reservedResources: {{cpu: 1}}\nonExhausted: {}",
    "balloonTypes[0].name": "reservedResources: {{cpu: 1}}\nballoonTypes: [{{name: {}}}]",
    "balloonTypes[a].minCPUs": "reservedResources: {{cpu: 1}}\nballoonTypes: [{{name: a, minCPUs: {}}}]",
    "balloonTypes[a].shareIdleCPUsInSame": "reservedResources: {{cpu: 1}}\nballoonTypes: [{{name: a, shareIdleCPUsInSame: {}}}]",
    "balloonTypes[a].matchExpressions[0].operator":
        "reservedResources: {{cpu: 1}}\nballoonTypes: [{{name: a, matchExpressions: [{{key: k, operator: {}}}]}}]",
}


def test_a_billion_laughs_in_a_value_is_shown_cut_short(tmp_path) -> None:
    paths = []
    for i, text in enumerate(LAUGHS.values()):
        paths.append(tmp_path / f"{i}.yaml")
        paths[-1].write_text(text.format(inline_laughs(7)) + "\n")
    script = (
        "import sys; from hooks.balloons.config import ConfigError, load_config_file\n"
        "for name in sys.argv[1:]:\n"
        "    try: load_config_file(name)\n"
        "    except ConfigError as e: print(e)\n"
    )
    # A hang guard: printed out, each message was 28 MB at 7 levels.
    done = subprocess.run([sys.executable, "-c", script, *map(str, paths)], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert len(lines) == len(LAUGHS), done.stderr[-2000:]
    for line, where in zip(lines, LAUGHS, strict=True):
        assert line.startswith(f"{where}: ") and LAUGHS_SHOWN in line and len(line) < 400, line[:300]


# runtimeEndpoint is a socket as the proxy's are: an endpoint URL is its path,
# anything naming no absolute path is refused (every listing failed at run time).
@pytest.mark.parametrize(
    ("written", "path"),
    [("/run/x.sock", "/run/x.sock"), ("unix:///run/x.sock", "/run/x.sock"), ("unix:/run/x.sock", "/run/x.sock"),
     ("UNIX:///run/x.sock", "/run/x.sock"), ("/run/a#b.sock", "/run/a#b.sock")],
)
def test_a_runtime_endpoint_is_the_path_it_names(written: str, path: str) -> None:
    config = parse_config({"reservedResources": {"cpu": 1}, "runtimeEndpoint": written})
    assert config.runtime_endpoint == path


@pytest.mark.parametrize(
    ("written", "reason"),
    [
        ("run/x.sock", "expected an absolute socket path (/PATH or unix:///PATH)"),
        ("unix:run/x.sock", "unix:NAME is a path relative to the current directory"),
        ("tcp://1.2.3.4:1", "expected a unix socket path, not a tcp: endpoint"),
        ("unix-abstract:ctr", "expected a unix socket path, not a unix-abstract: endpoint"),
        ("unix:///run/x.sock#f", "a unix: URL with %, ? or # names another socket"),
        ("unix:///", "names no socket path"),
        ("/run/a,b.sock", "a comma in a unix socket path: grpc reads it as a separator"),  # dialled elsewhere
        ("unix:///run/a,b.sock", "a comma in a unix socket path: grpc reads it as a separator"),
    ],
)
def test_a_runtime_endpoint_naming_no_absolute_path_is_refused(written: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"reservedResources": {"cpu": 1}, "runtimeEndpoint": written})
    assert str(info.value).startswith(f"runtimeEndpoint {written!r}: {reason}")
