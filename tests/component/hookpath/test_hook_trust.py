"""Issue 11 hole 6: a hook endpoint someone else could own is never called.

Real hook-server processes through the whole proxy (fake backend). We are
root: the socket is really chowned to another uid, the directory really made
writable by anyone.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import grpc
import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from hooks.sdk import write_hook_config
from runtimeproxy.app import RunningProxy

from ...hookprocs import NOBODY, dir_for_nobody, hook_server, registered, served_by_nobody
from ...prerequisites import fail_or_skip
from ..fakes import FakeBackend

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
INJECT = {"PreCreateContainer": {"container_envs": {"INJECTED": "1"}, "container_annotations": {"squatter": "yes"}}}


def create_request() -> v1.CreateContainerRequest:
    return v1.CreateContainerRequest(
        pod_sandbox_id="pod-1",
        config=v1.ContainerConfig(metadata=v1.ContainerMetadata(name="app", attempt=1), annotations={"c-note": "y"}),
        sandbox_config=v1.PodSandboxConfig(metadata=v1.PodSandboxMetadata(name="web", uid="uid-1", namespace="default")),
    )


def untrusted_calls(running: RunningProxy, name: str) -> float | None:
    return running.metrics.registry.get_sample_value(
        "runtime_proxy_hook_calls_total",
        {"server": f"{name}.json", "hook": "PreCreateContainer", "outcome": "untrusted_endpoint"},
    )


async def test_socket_owned_by_another_user_is_refused_under_fail(
    running: RunningProxy, fake: FakeBackend, client: aio.Channel, sock_dir: Path, hook_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with hook_server(sock_dir, "squat", INJECT) as hook:
        os.chown(hook.socket, NOBODY, NOBODY)  # what an unprivileged squatter's socket looks like
        hook.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail")
        await registered(running, 1)
        with pytest.raises(aio.AioRpcError) as err:
            await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
        assert hook.requests() == [], "the untrusted server was never called"
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "untrusted endpoint" in err.value.details() and f"owned by uid {NOBODY}" in err.value.details()
    assert fake.calls(CREATE) == []
    assert untrusted_calls(running, "squat") == 1
    # What `status` shows as the server's last error: why it was refused.
    last = running.metrics.hook_stats["squat.json"].last_error
    assert last is not None and last["outcome"] == "untrusted_endpoint"
    assert last["cause"] == f"untrusted endpoint: socket {hook.socket} is owned by uid {NOBODY}, not root"
    assert any(
        r.levelno == logging.ERROR and "untrusted endpoint" in getattr(r, "error", "") for r in caplog.records
    )


@pytest.mark.parametrize("mode", [0o777, 0o1777], ids=["world-writable", "sticky-tmp-like"])
async def test_socket_in_a_directory_anyone_can_write_is_skipped_under_ignore(
    running: RunningProxy, fake: FakeBackend, client: aio.Channel, sock_dir: Path, hook_dir: Path,
    caplog: pytest.LogCaptureFixture, mode: int,
) -> None:
    shared = sock_dir / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    async with hook_server(shared, "open", INJECT) as hook:
        hook.register(hook_dir, ["PreCreateContainer"], failure_policy="Ignore")
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
        assert hook.requests() == []
    sent = v1.CreateContainerRequest.FromString(fake.calls(CREATE)[0].requests[0])
    assert sent == create_request(), "nothing injected"
    assert untrusted_calls(running, "open") == 1
    [line] = [r for r in caplog.records if "untrusted endpoint" in getattr(r, "error", "")]
    assert line.levelno == logging.WARNING and "writable by others" in line.error  # type: ignore[attr-defined]


async def test_a_socket_replaced_after_registration_is_judged_at_the_next_dial(
    running: RunningProxy, fake: FakeBackend, client: aio.Channel, sock_dir: Path, hook_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The proxy's connection to a trusted server ends with it; the next call
    dials what is at the path now and judges it. (Guards what per-call checks
    also did, now that the check runs at the dial.)"""
    async with hook_server(sock_dir, "swap", INJECT) as hook:
        hook.register(hook_dir, ["PreCreateContainer"], failure_policy="Fail")
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
        assert len(hook.requests()) == 1  # trusted: called and applied
        first_calls = len(hook.requests())
    # The file is unchanged; what listens at its endpoint is not: someone
    # else's server, which the proxy's connection to the first one never reached.
    async with hook_server(sock_dir, "swap", INJECT) as squatter:
        os.chown(squatter.socket, NOBODY, NOBODY)
        with pytest.raises(aio.AioRpcError) as err:
            await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
        # Both servers keep their requests in one record, the endpoint's:
        # the squatter's are what came after the first server's.
        squatter_calls = len(squatter.requests()) - first_calls
        assert squatter_calls == 0, "the squatter was never called"
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "untrusted endpoint" in err.value.details() and f"owned by uid {NOBODY}" in err.value.details()
    assert len(fake.calls(CREATE)) == 1
    assert untrusted_calls(running, "swap") == 1
    assert any(
        r.levelno == logging.ERROR and "untrusted endpoint" in getattr(r, "error", "") for r in caplog.records
    )


async def test_a_root_owned_socket_served_by_another_user_is_refused_under_fail(
    running: RunningProxy, fake: FakeBackend, client: aio.Channel, hook_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The socket looks right (root's, in a directory only its owner writes)
    but nobody's process serves it, as one swapped in between the proxy's
    look and its connect would: the server is judged once connected
    (SO_PEERCRED), refused and counted as an untrusted endpoint, never
    called (before: called, the socket file being all that was judged)."""
    if os.geteuid() != 0:
        fail_or_skip("needs root to run a hook server as another user (CI runs as root)")
    with dir_for_nobody() as directory:
        socket = directory / "peer.sock"
        async with served_by_nobody(socket) as server:
            os.chown(socket, 0, 0)
            write_hook_config(hook_dir, "peer", socket, ["PreCreateContainer"], "Fail")
            await registered(running, 1)
            with pytest.raises(aio.AioRpcError) as err:
                await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
        assert server.calls == 0
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    cause = (
        f"untrusted endpoint: the server connected to at {socket}: pid {server.process.pid} listened on it as "
        f"uid {NOBODY}, not root; was the socket replaced after it was checked, or is it listened on by a user "
        "not trusted to own it?"
    )
    assert cause in err.value.details()
    assert fake.calls(CREATE) == []
    assert untrusted_calls(running, "peer") == 1
    last = running.metrics.hook_stats["peer.json"].last_error
    assert last is not None and last["outcome"] == "untrusted_endpoint" and last["cause"] == cause
    assert any(r.levelno == logging.ERROR and cause in getattr(r, "error", "") for r in caplog.records)
