"""A whole answer's clear is logged at info once per container and field,
then at debug (kubelet sends a refused update again every 10 s), in a
bounded memory: the oldest containers are forgotten first."""

from __future__ import annotations

import logging

import pytest

from cri_api.hookapi import api_pb2 as hookapi
from runtimeproxy.hookpath import wholeanswers
from runtimeproxy.hookpath.hookfile import Answers, FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.points import HookType

HOOK = HookType.PRE_UPDATE_CONTAINER_RESOURCES
KOORDLET = HookServerConfig("koordlet.json", "/run/k.sock", FailurePolicy.IGNORE, frozenset({HOOK}), answers=Answers.WHOLE)


def shown(name: str) -> hookapi.ContainerResourceHookRequest:
    return hookapi.ContainerResourceHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name="web", namespace="default", uid="u1"),
        container_meta=hookapi.ContainerMetadata(name=name),
    )


def levels(caplog: pytest.LogCaptureFixture) -> list[int]:
    out = [r.levelno for r in caplog.records if r.name == wholeanswers.__name__]
    caplog.clear()
    return out


@pytest.mark.parametrize("applies", [True, False], ids=["cri", "nri"])
def test_info_once_per_container_and_field(caplog: pytest.LogCaptureFixture, applies: bool) -> None:
    caplog.set_level(logging.DEBUG, wholeanswers.__name__)
    whole = wholeanswers.WholeAnswers(applies)
    cpus, both = ("cpuset_cpus",), ("cpuset_cpus", "cpuset_mems")
    for names, ctr in [(cpus, "a"), (cpus, "a"), (cpus, "a"), (both, "a"), (both, "a"), (cpus, "b")]:
        whole.cleared(names, KOORDLET, shown(ctr), HOOK, {})
    assert levels(caplog) == [logging.INFO, logging.DEBUG, logging.DEBUG, logging.INFO, logging.DEBUG, logging.INFO]


def test_the_oldest_containers_are_forgotten(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG, wholeanswers.__name__)
    monkeypatch.setattr(wholeanswers, "_REMEMBERED", 2)
    whole = wholeanswers.WholeAnswers()
    for ctr in ["a", "b", "c", "c", "a"]:
        whole.cleared(("cpuset_cpus",), KOORDLET, shown(ctr), HOOK, {})
    assert levels(caplog) == [logging.INFO] * 3 + [logging.DEBUG, logging.INFO]
