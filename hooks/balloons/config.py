"""The balloons hook's YAML config: the NRI balloons policy's keys, checked.

An operator's NRI (or CRI Resource Manager) balloons config carries over: the
keys this hook implements are read; the NRI keys it does not implement are
accepted and reported as warnings; anything else is an error naming the key
(a typo such as ``maxCpus`` must not silently change placement). A whole
``BalloonsPolicy`` custom resource is accepted too: its ``spec`` is read.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from runtimeproxy import yamlkeys
from runtimeproxy.shown import shown

from ..criclient import DEFAULT_RUNTIME_ENDPOINT, endpoint_socket
from .matching import OPERATORS, MatchExpression, PodContext
from .topology import parse_cpuset

__all__ = [
    "BALLOON_ANNOTATION", "DEFAULT", "OPERATORS", "RESERVED", "BalloonType", "BalloonsConfig", "ConfigError",
    "MatchExpression", "PodContext", "load_config_file", "parse_config", "parse_milli_cpus",
]

# The pod annotation that names a balloon type (NRI's); the "/container.NAME" form names one for a container.
BALLOON_ANNOTATION = "balloon.balloons.resource-policy.nri.io"
RESERVED = "reserved"
DEFAULT = "default"
SHARE_SCOPES = ("system", "package", "numa", "core")
EXHAUSTED_POLICIES = ("Fail", "Ignore")

TOP_KEYS = {
    "reservedResources", "availableResources", "reservedPoolNamespaces", "balloonTypes",
    "pinCPU", "pinMemory", "runtimeEndpoint", "onExhausted", "stateDir",
}
TYPE_KEYS = {
    "name", "namespaces", "matchExpressions", "minCPUs", "maxCPUs", "minBalloons", "maxBalloons",
    "preferNewBalloons", "shareIdleCPUsInSame",
}
# NRI balloons keys this hook accepts but does not act on: reported, never an error.
NRI_TOP_KEYS_IGNORED = {
    "allocatorTopologyBalancing", "preferSpreadOnPhysicalCores", "idleCPUClass", "agent", "log",
    "instrumentation", "control", "showContainersInNrt",
}
NRI_TYPE_KEYS_IGNORED = {
    "cpuClass", "allocatorPriority", "preferCoreType", "hideHyperthreads", "memoryTypes", "pinMemory",
    "preferSpreadingPods", "preferPerNamespaceBalloon", "preferIsolCpus", "allocatorTopologyBalancing",
    "preferSpreadOnPhysicalCores", "loads", "components",
}


class ConfigError(ValueError):
    """The config is not valid; the message names the key and the reason."""


@dataclass(frozen=True)
class BalloonType:
    name: str
    namespaces: tuple[str, ...] = ()
    match_expressions: tuple[MatchExpression, ...] = ()
    min_cpus: int = 0
    max_cpus: int = 0  # 0: no limit
    min_balloons: int = 0
    max_balloons: int = 0  # 0: no limit
    prefer_new_balloons: bool = False
    share_idle_cpus_in_same: str = ""  # "" (no sharing) or one of SHARE_SCOPES

    def holds(self, milli: int) -> bool:
        """Whether a container asking ``milli`` fits within maxCPUs, on its own."""
        return not self.max_cpus or math.ceil(milli / 1000) <= self.max_cpus

    def has_room(self, count: int) -> bool:
        """Whether another balloon may be made beside ``count`` of this type (maxBalloons)."""
        return not self.max_balloons or count < self.max_balloons


@dataclass(frozen=True)
class BalloonsConfig:
    reserved_cpuset: frozenset[int] | None  # "cpuset:..." form
    reserved_milli: int  # quantity form (0 with a cpuset)
    available_cpuset: frozenset[int] | None
    reserved_pool_namespaces: tuple[str, ...]
    balloon_types: tuple[BalloonType, ...]
    pin_cpu: bool = True
    pin_memory: bool = True
    runtime_endpoint: str = DEFAULT_RUNTIME_ENDPOINT
    on_exhausted: str = "Fail"
    # Where the reserved CPUs are saved for a restart (savedreserved.py); "": not saved.
    state_dir: str = ""
    warnings: tuple[str, ...] = ()

    @property
    def reserved_count(self) -> int:
        """The reserved CPUs a quantity asks, rounded up to whole CPUs (0 with a cpuset)."""
        return math.ceil(self.reserved_milli / 1000)

    def available_cpus(self, online: frozenset[int]) -> frozenset[int]:
        """The CPUs balloons may use out of ``online`` (availableResources)."""
        return online if self.available_cpuset is None else self.available_cpuset & online

    def type_named(self, name: str) -> BalloonType | None:
        return self.types_by_name.get(name)

    def plans_as(self, other: BalloonsConfig) -> bool:
        """Placement goes by the same keys in both: a reload of the same
        config (its warnings of ignored keys, its runtimeEndpoint and its
        stateDir aside)."""
        return self.for_placement() == other.for_placement()

    def for_placement(self) -> BalloonsConfig:
        """This config with the keys placement does not go by set to their defaults."""
        return replace(self, warnings=(), runtime_endpoint=DEFAULT_RUNTIME_ENDPOINT, state_dir="")

    # Cached (a frozen config does not change): every placement looks types up.
    @cached_property
    def all_types(self) -> tuple[BalloonType, ...]:
        """The configured types plus the built-in reserved and default ones when not overridden."""
        names = {t.name for t in self.balloon_types}
        out = list(self.balloon_types)
        if RESERVED not in names:
            out.append(BalloonType(RESERVED))
        if DEFAULT not in names:
            out.append(BalloonType(DEFAULT, max_balloons=1))
        return tuple(out)

    @cached_property
    def types_by_name(self) -> Mapping[str, BalloonType]:
        return MappingProxyType({t.name: t for t in self.all_types})


def _unknown(where: str, key: str, known: set[str]) -> ConfigError:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"{where}: unknown key {shown(key)}{hint}")


def _check_keys(where: str, doc: Mapping[str, Any], known: set[str], ignored: set[str], warnings: list[str]) -> None:
    for key in doc:
        if key in ignored:
            warnings.append(f"{where}{key}: an NRI balloons key this hook does not implement; ignored")
        elif key not in known:
            raise _unknown(where.rstrip(".") or "config", str(key), known | ignored)


def _int(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: expected a whole number >= 0, got {shown(value)}")
    return value


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {shown(value)}")
    return value


def _strings(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: expected a list of strings, got {shown(value)}")
    return tuple(value)


def _cpuset(where: str, value: str) -> frozenset[int]:
    try:
        cpus = parse_cpuset(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: bad cpuset {shown(value)}: {exc}") from None
    if not cpus:
        raise ConfigError(f"{where}: empty cpuset")
    return cpus


def parse_milli_cpus(where: str, value: Any) -> int:
    """A CPU quantity ('1000m', '1.5', 2) in milli-CPUs."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):  # never str() a list: a billion laughs
        raise ConfigError(f"{where}: expected a CPU quantity, got {shown(value)}")
    text = str(value).strip()
    try:
        milli = float(text[:-1]) if text.endswith("m") else float(text) * 1000
    except ValueError:
        raise ConfigError(f"{where}: expected 'cpuset:LIST' or a CPU quantity like '1000m' or '2', got {shown(value)}") from None
    if not math.isfinite(milli) or milli <= 0:
        raise ConfigError(f"{where}: expected a positive CPU quantity, got {shown(value)}")
    return math.ceil(milli)


def _expression(where: str, doc: Any) -> MatchExpression:
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{where}: expected a mapping with key, operator, values")
    for key in doc:
        if key not in ("key", "operator", "values"):
            raise _unknown(where, str(key), {"key", "operator", "values"})
    key, op = doc.get("key"), doc.get("operator")
    if not isinstance(key, str) or not key:
        raise ConfigError(f"{where}.key: required, a string")
    if key.startswith("pod/") and not (key in ("pod/name", "pod/namespace") or key.startswith("pod/labels/")):
        raise ConfigError(f"{where}.key: {shown(key)} is not supported (pod/name, pod/namespace, pod/labels/KEY, name, namespace, labels/KEY)")
    if not isinstance(op, str) or op not in OPERATORS:  # a list is no set member: a TypeError
        raise ConfigError(f"{where}.operator: {shown(op)} is not one of {', '.join(sorted(OPERATORS))}")
    values = _strings(f"{where}.values", doc.get("values", []))
    if op in ("Equals", "NotEqual") and len(values) != 1:
        raise ConfigError(f"{where}.values: {op} takes exactly one value")
    if op in ("In", "NotIn", "Matches", "MatchesNot", "MatchesAny", "MatchesNone") and not values:
        raise ConfigError(f"{where}.values: {op} needs at least one value")
    return MatchExpression(key, op, values)


def _balloon_type(where: str, doc: Any, warnings: list[str]) -> BalloonType:
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    _check_keys(f"{where}.", doc, TYPE_KEYS, NRI_TYPE_KEYS_IGNORED, warnings)
    name = doc.get("name")
    if not isinstance(name, str) or not name or any(c in name for c in "[]{}/ "):
        raise ConfigError(f"{where}.name: required, a name without spaces, brackets or slashes; got {shown(name)}")
    where = f"balloonTypes[{name}]"
    exprs = doc.get("matchExpressions", [])
    if not isinstance(exprs, list):
        raise ConfigError(f"{where}.matchExpressions: expected a list")
    scope = doc.get("shareIdleCPUsInSame", "")
    if scope not in ("", *SHARE_SCOPES):
        raise ConfigError(f"{where}.shareIdleCPUsInSame: {shown(scope)} is not supported (one of {', '.join(SHARE_SCOPES)})")
    btype = BalloonType(
        name=name,
        namespaces=_strings(f"{where}.namespaces", doc.get("namespaces", [])),
        match_expressions=tuple(_expression(f"{where}.matchExpressions[{i}]", e) for i, e in enumerate(exprs)),
        min_cpus=_int(f"{where}.minCPUs", doc.get("minCPUs", 0)),
        max_cpus=_int(f"{where}.maxCPUs", doc.get("maxCPUs", 0)),
        min_balloons=_int(f"{where}.minBalloons", doc.get("minBalloons", 0)),
        max_balloons=_int(f"{where}.maxBalloons", doc.get("maxBalloons", 0)),
        prefer_new_balloons=_bool(f"{where}.preferNewBalloons", doc.get("preferNewBalloons", False)),
        share_idle_cpus_in_same=scope,
    )
    if btype.max_cpus and btype.min_cpus > btype.max_cpus:
        raise ConfigError(f"{where}: minCPUs {btype.min_cpus} is more than maxCPUs {btype.max_cpus}")
    if btype.max_balloons and btype.min_balloons > btype.max_balloons:
        raise ConfigError(f"{where}: minBalloons {btype.min_balloons} is more than maxBalloons {btype.max_balloons}")
    return btype


def parse_config(doc: Any) -> BalloonsConfig:
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise ConfigError(f"config: expected a mapping, got {type(doc).__name__}")
    if doc.get("kind") == "BalloonsPolicy" and isinstance(doc.get("spec"), Mapping):
        doc = doc["spec"]  # a whole custom resource, as applied to an NRI cluster
    warnings: list[str] = []
    _check_keys("", doc, TOP_KEYS, NRI_TOP_KEYS_IGNORED, warnings)

    reserved_doc = doc.get("reservedResources")
    if not isinstance(reserved_doc, Mapping) or "cpu" not in reserved_doc:
        raise ConfigError("reservedResources.cpu: required ('cpuset:0' or a quantity like '1000m')")
    for key in reserved_doc:
        if key != "cpu":
            raise _unknown("reservedResources", str(key), {"cpu"})
    reserved = reserved_doc["cpu"]
    reserved_cpuset, reserved_milli = None, 0
    if isinstance(reserved, str) and reserved.startswith("cpuset:"):
        reserved_cpuset = _cpuset("reservedResources.cpu", reserved.removeprefix("cpuset:"))
    else:
        reserved_milli = parse_milli_cpus("reservedResources.cpu", reserved)

    available = None
    available_doc = doc.get("availableResources")
    if available_doc is not None:
        if not isinstance(available_doc, Mapping):
            raise ConfigError("availableResources: expected a mapping with 'cpu'")
        for key in available_doc:
            if key != "cpu":
                raise _unknown("availableResources", str(key), {"cpu"})
        value = available_doc.get("cpu")
        if not (isinstance(value, str) and value.startswith("cpuset:")):
            raise ConfigError(f"availableResources.cpu: expected 'cpuset:LIST', got {shown(value)}")
        available = _cpuset("availableResources.cpu", value.removeprefix("cpuset:"))
        if reserved_cpuset is not None and not reserved_cpuset <= available:
            raise ConfigError("reservedResources.cpu: reserved CPUs must be among availableResources.cpu")

    types_doc = doc.get("balloonTypes", [])
    if not isinstance(types_doc, list):
        raise ConfigError("balloonTypes: expected a list")
    types = tuple(_balloon_type(f"balloonTypes[{i}]", t, warnings) for i, t in enumerate(types_doc))
    seen: set[str] = set()
    for btype in types:
        if btype.name in seen:
            raise ConfigError(f"balloonTypes: the name {shown(btype.name)} is used twice")
        seen.add(btype.name)

    endpoint = _endpoint(doc.get("runtimeEndpoint", DEFAULT_RUNTIME_ENDPOINT))
    on_exhausted = doc.get("onExhausted", "Fail")
    if on_exhausted not in EXHAUSTED_POLICIES:
        raise ConfigError(f"onExhausted: expected Fail or Ignore, got {shown(on_exhausted)}")
    return BalloonsConfig(
        reserved_cpuset=reserved_cpuset,
        reserved_milli=reserved_milli,
        available_cpuset=available,
        reserved_pool_namespaces=_strings("reservedPoolNamespaces", doc.get("reservedPoolNamespaces", ["kube-system"])),
        balloon_types=types,
        pin_cpu=_bool("pinCPU", doc.get("pinCPU", True)),
        pin_memory=_bool("pinMemory", doc.get("pinMemory", True)),
        runtime_endpoint=endpoint,
        on_exhausted=on_exhausted,
        state_dir=_state_dir(doc.get("stateDir", "")),
        warnings=tuple(warnings),
    )


def _state_dir(value: Any) -> str:
    """stateDir: an absolute directory path, or "" or left empty (null: the reserved CPUs are not saved)."""
    if value is None:
        return ""
    if not isinstance(value, str) or "\0" in value or (value and not value.startswith("/")):
        raise ConfigError(f"stateDir: expected an absolute directory path, or \"\" for none, got {shown(value)}")
    return value


def _endpoint(value: Any) -> str:
    """runtimeEndpoint as the absolute path it names (see :func:`hooks.criclient.endpoint_socket`)."""
    try:
        return endpoint_socket(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def load_config_file(path: str | Path) -> BalloonsConfig:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    try:
        parsed = yamlkeys.Document(text)
        doc = parsed.value()
        repeats = parsed.repeats()
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from None
    # A key given twice, as hook run's start reads it (hooks/cli.py): a reload
    # taking what the next start refuses would leave the hook down after a reboot.
    warnings: list[str] = []
    yamlkeys.check_repeats(repeats, lambda repeat: ConfigError(f"{path}: {repeat}"), lambda repeat: warnings.append(str(repeat)))
    config = parse_config(doc)
    return replace(config, warnings=(*warnings, *config.warnings))
