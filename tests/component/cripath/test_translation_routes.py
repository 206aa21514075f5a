"""Issue: CRI v1alpha2 <-> v1 translation, against fake backends that serve
v1 only, v1alpha2 only or both, and record what arrives in which version:
the version each call goes to, the choice logged at start-up, and a forced
version the backend lacks."""

from __future__ import annotations

import logging
from typing import Any

import grpc
import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1

from . import translationcases
from .translationcases import (
    BOTH,
    ONLY_V1,
    ONLY_V1ALPHA2,
    UNKNOWN_FIELD,
    api,
    backend_paths,
    common_create,
    path,
)

backend = translationcases.backend  # the fixtures, here for pytest (and the grpcpath mirror) to find
proxy_for = translationcases.proxy_for


# (backend versions, serve_versions, backend_version, client version) -> target version, or None: not served
CASES = [
    # the explicit matrix, every cell served
    (ONLY_V1, "v1,v1alpha2", None, "v1", "v1"),
    (ONLY_V1, "v1,v1alpha2", None, "v1alpha2", "v1"),
    (ONLY_V1ALPHA2, "v1,v1alpha2", None, "v1", "v1alpha2"),
    (ONLY_V1ALPHA2, "v1,v1alpha2", None, "v1alpha2", "v1alpha2"),
    (BOTH, "v1,v1alpha2", None, "v1", "v1"),
    (BOTH, "v1,v1alpha2", None, "v1alpha2", "v1alpha2"),
    # auto: what the backend serves, natively
    (ONLY_V1, "auto", None, "v1", "v1"),
    (ONLY_V1, "auto", None, "v1alpha2", None),
    (ONLY_V1ALPHA2, "auto", None, "v1", None),
    (ONLY_V1ALPHA2, "auto", None, "v1alpha2", "v1alpha2"),
    (BOTH, "auto", None, "v1", "v1"),
    (BOTH, "auto", None, "v1alpha2", "v1alpha2"),
    # a single served version
    (ONLY_V1, "v1alpha2", None, "v1alpha2", "v1"),
    (ONLY_V1, "v1alpha2", None, "v1", None),
    (BOTH, "v1alpha2", None, "v1", None),
    # --backend-version against a backend serving both
    (BOTH, "auto", "v1", "v1", "v1"),
    (BOTH, "auto", "v1", "v1alpha2", "v1"),
    (BOTH, "auto", "v1alpha2", "v1", "v1alpha2"),
    (BOTH, "auto", "v1alpha2", "v1alpha2", "v1alpha2"),
    (BOTH, "v1,v1alpha2", "v1", "v1alpha2", "v1"),
    (BOTH, "v1,v1alpha2", "v1alpha2", "v1", "v1alpha2"),
]


def case_id(case: tuple[Any, ...]) -> str:
    backend, serve, forced, client, target = case
    force = f"-force={forced}" if forced else ""
    return f"backend={'+'.join(sorted(backend))}-serve={serve}{force}-client={client}->{target or 'refused'}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
async def test_calls_arrive_in_the_target_version_with_the_same_bytes(proxy_for, client, case) -> None:
    versions, serve, forced, client_version, target = case
    fake, proxy = await proxy_for(versions, serve_versions=serve, backend_version=forced)
    assert proxy.router.plan.routes.get(client_version) == target
    c, t = api(client_version), api(target or "v1")

    list_request = c.ListContainersRequest(filter=c.ContainerFilter(state=c.ContainerStateValue(state=1))).SerializeToString()
    list_reply = t.ListContainersResponse(
        containers=[t.Container(id="c1", pod_sandbox_id="p1", state=1, labels={"app": "web"})]
    ).SerializeToString()
    create_request = common_create(client_version).SerializeToString()
    pull_request = c.PullImageRequest(
        image=c.ImageSpec(image="docker.io/library/busybox:1"), auth=c.AuthConfig(username="u", password="p")
    ).SerializeToString()
    pull_reply = t.PullImageResponse(image_ref="sha256:abc").SerializeToString()
    exec_request = c.ExecSyncRequest(container_id="c1", cmd=["echo", "hi"], timeout=5).SerializeToString()
    exec_reply = t.ExecSyncResponse(stdout=b"hi\n", stderr=b"\x00\xff", exit_code=3).SerializeToString()
    future_request = b"\x0a\x03abc" + UNKNOWN_FIELD

    calls = [
        (path(client_version, "ListContainers"), list_request, list_reply),
        (path(client_version, "CreateContainer"), create_request, None),  # echoed
        (path(client_version, "PullImage", "ImageService"), pull_request, pull_reply),
        (path(client_version, "ExecSync"), exec_request, exec_reply),
        (path(client_version, "SomeFutureMethod"), future_request, None),  # no proto: relayed as a stream
    ]

    if target is None:
        for call_path, request, _ in calls:
            with pytest.raises(aio.AioRpcError) as err:
                await client.unary_unary(call_path)(request)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert f"does not serve CRI {client_version}" in err.value.details()
            assert call_path in err.value.details()
            assert f"serves {', '.join(sorted(versions))}" in err.value.details()
        assert backend_paths(fake) == []
        return

    for call_path, request, reply in calls:
        backend_path = call_path.replace(f"runtime.{client_version}.", f"runtime.{target}.")
        if reply is None:
            fake.script(backend_path, echo=True)
        else:
            fake.script(backend_path, response=reply)
        assert await client.unary_unary(call_path)(request) == (reply if reply is not None else request)
        [received] = fake.calls(backend_path)
        assert received.requests == [request]

    expected_paths = [c_path.replace(f"runtime.{client_version}.", f"runtime.{target}.") for c_path, _, _ in calls]
    if client_version == "v1":  # GetContainerEvents is v1's own
        events_path = path("v1", "GetContainerEvents")
        events = [
            v1.ContainerEventResponse(container_id=f"c{i}", container_event_type=i % 4).SerializeToString()
            for i in range(5)
        ]
        if target == "v1":
            fake.script(events_path, stream=events)
            call = client.unary_stream(events_path)(v1.GetEventsRequest().SerializeToString())
            assert [m async for m in call] == events
            expected_paths.append(events_path)
        else:
            with pytest.raises(aio.AioRpcError) as err:
                [m async for m in client.unary_stream(events_path)(b"")]
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    # Everything arrived once, in the target version, nothing in the other one.
    assert backend_paths(fake) == expected_paths


@pytest.mark.parametrize(
    ("versions", "serve", "forced", "served", "text"),
    [
        (ONLY_V1, "v1,v1alpha2", None, {"v1", "v1alpha2"}, "serving v1 (native), v1alpha2 (translated to v1)"),
        (ONLY_V1ALPHA2, "v1,v1alpha2", None, {"v1", "v1alpha2"}, "serving v1 (translated to v1alpha2), v1alpha2 (native)"),
        (ONLY_V1, "auto", None, {"v1"}, "serving v1 (native)"),
        (ONLY_V1ALPHA2, "auto", None, {"v1alpha2"}, "serving v1alpha2 (native)"),
        (BOTH, "auto", None, {"v1", "v1alpha2"}, "serving v1 (native), v1alpha2 (native)"),
        (BOTH, "auto", "v1", {"v1", "v1alpha2"}, "serving v1 (native), v1alpha2 (translated to v1)"),
        (BOTH, "auto", "v1alpha2", {"v1", "v1alpha2"}, "serving v1 (translated to v1alpha2), v1alpha2 (native)"),
    ],
    ids=["v1-only", "v1alpha2-only", "auto-v1-only", "auto-v1alpha2-only", "auto-both", "force-v1", "force-v1alpha2"],
)
async def test_the_choice_is_logged_once_at_start_up(proxy_for, caplog, versions, serve, forced, served, text) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy")
    _, proxy = await proxy_for(versions, serve_versions=serve, backend_version=forced)
    assert set(proxy.router.plan.served) == served
    serving = [r for r in caplog.records if r.getMessage().startswith("serving ")]
    assert [r.getMessage() for r in serving] == [text]
    assert serving[0].levelno == logging.INFO
    assert serving[0].runtime == f"fake 1.0 (CRI {', '.join(sorted(versions))})"


# --------------------------------------------------------------------------- forcing a version the backend lacks


@pytest.mark.parametrize(
    ("versions", "forced"), [(ONLY_V1, "v1alpha2"), (ONLY_V1ALPHA2, "v1")], ids=["v1-only", "v1alpha2-only"]
)
async def test_forcing_a_version_the_backend_lacks_fails_every_call(proxy_for, client, caplog, versions, forced) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy")
    fake, proxy = await proxy_for(versions, serve_versions="v1,v1alpha2", backend_version=forced)
    assert proxy.router.plan is None
    expected = f"runtime-proxy: backend-version {forced} forced, but the backend serves only {', '.join(sorted(versions))}"
    for version in ("v1", "v1alpha2"):
        for method in ("ListContainers", "Version", "SomeFutureMethod"):
            with pytest.raises(aio.AioRpcError) as err:
                await client.unary_unary(path(version, method))(b"")
            assert (err.value.code(), err.value.details()) == (grpc.StatusCode.FAILED_PRECONDITION, expected)
    with pytest.raises(aio.AioRpcError) as err:
        [m async for m in client.unary_stream(path("v1", "GetContainerEvents"))(b"")]
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert backend_paths(fake) == []
    [error] = [r for r in caplog.records if r.getMessage() == "cannot serve this backend"]
    assert error.levelno == logging.ERROR
    assert f"backend-version {forced} forced" in error.error
    assert not [r for r in caplog.records if r.getMessage().startswith("serving ")]
