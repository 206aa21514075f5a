"""Issue: CRI v1alpha2 <-> v1 translation, against fake backends that serve
v1 only, v1alpha2 only or both, and record what arrives in which version."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1alpha2 import api_pb2 as v1alpha2
from runtimeproxy.app import build_proxy
from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath.fieldcheck import V1OnlyFieldCheck

from ..fakes import FakeBackend, is_probe

ONLY_V1 = frozenset({"v1"})
ONLY_V1ALPHA2 = frozenset({"v1alpha2"})
BOTH = frozenset({"v1", "v1alpha2"})

UNKNOWN_FIELD = bytes([0xBA, 0x3E, 0x03]) + b"xyz"  # field 999, length 3: no schema knows it
RAW_ENV = b"\xff\xfe"  # not UTF-8: a v1 bytes value, a v1alpha2 string on the wire


def path(version: str, method: str, service: str = "RuntimeService") -> str:
    return f"/runtime.{version}.{service}/{method}"


def api(version: str) -> ModuleType:
    return v1 if version == "v1" else v1alpha2


def backend_paths(fake: FakeBackend) -> list[str]:
    """What reached the backend, apart from the proxy's version probes."""
    return [r.path for r in fake.received if not is_probe(r.path)]


def common_create(version: str) -> Any:
    """A CreateContainerRequest with fields both versions have, in the client's own schema."""
    m = api(version)
    return m.CreateContainerRequest(
        pod_sandbox_id="pod-1",
        config=m.ContainerConfig(
            metadata=m.ContainerMetadata(name="app", attempt=1),
            image=m.ImageSpec(image="busybox", annotations={"a": "b"}),
            command=["sleep", "1"],
            envs=[m.KeyValue(key="K", value=b"v" if version == "v1" else "v")],
            mounts=[m.Mount(container_path="/data", host_path="/srv", readonly=True, propagation=1)],
            labels={"app": "web"},
            linux=m.LinuxContainerConfig(
                resources=m.LinuxContainerResources(cpu_shares=256, memory_limit_in_bytes=1 << 30),
                security_context=m.LinuxContainerSecurityContext(run_as_user=m.Int64Value(value=1000)),
            ),
        ),
        sandbox_config=m.PodSandboxConfig(metadata=m.PodSandboxMetadata(name="web", uid="u", namespace="default")),
    )


@pytest.fixture
async def backend(sock_dir: Path) -> AsyncIterator[Any]:
    """Start a fake backend serving the given versions (stopped afterwards)."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(versions: frozenset[str]) -> FakeBackend:
            return await stack.enter_async_context(FakeBackend(sock_dir / "b.sock", versions=versions))

        yield start


@pytest.fixture
def proxy_for(backend: Any, start_proxy: Any) -> Any:
    async def start(versions: frozenset[str], forward_unknown: bool = False, **settings: Any) -> tuple[FakeBackend, Any]:
        fake = await backend(versions)
        proxy = await start_proxy(fake.socket, stages=(V1OnlyFieldCheck(forward_unknown),), **settings)
        return fake, proxy

    return start


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


# --------------------------------------------------------------------------- v1 client, v1alpha2-only backend


@pytest.fixture
async def old_backend(proxy_for) -> FakeBackend:
    fake, _ = await proxy_for(ONLY_V1ALPHA2, serve_versions="v1,v1alpha2")
    return fake


@pytest.mark.parametrize(
    ("service", "method", "streaming"),
    [
        ("RuntimeService", "StreamContainers", True),
        ("RuntimeService", "GetContainerEvents", True),
        ("RuntimeService", "CheckpointContainer", False),
        ("RuntimeService", "ListPodSandboxMetrics", False),
        ("ImageService", "StreamImages", True),
    ],
)
async def test_v1_only_method_is_unimplemented_naming_method_and_backend_version(
    old_backend, client, service, method, streaming
) -> None:
    call_path = path("v1", method, service)
    with pytest.raises(aio.AioRpcError) as err:
        if streaming:
            [m async for m in client.unary_stream(call_path)(b"")]
        else:
            await client.unary_unary(call_path)(b"")
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    details = err.value.details()
    assert f"{service}/{method} does not exist in CRI v1alpha2" in details
    assert "the version runtime-proxy speaks to the backend fake 1.0" in details
    assert backend_paths(old_backend) == []


def create_with(**config: Any) -> v1.CreateContainerRequest:
    request = common_create("v1")
    request.config.MergeFrom(v1.ContainerConfig(**config))
    return request


REFUSED = [
    (create_with(CDI_devices=[v1.CDIDevice(name="vendor.com/gpu=0")]), ["config.CDI_devices"]),
    (
        create_with(mounts=[v1.Mount(container_path="/ro", host_path="/h", readonly=True, recursive_read_only=True)]),
        ["config.mounts[1].recursive_read_only"],  # mounts[0] is the common one
    ),
    (
        create_with(
            linux=v1.LinuxContainerConfig(
                security_context=v1.LinuxContainerSecurityContext(
                    supplemental_groups_policy=v1.SupplementalGroupsPolicy.Strict
                )
            )
        ),
        ["config.linux.security_context.supplemental_groups_policy"],
    ),
    (create_with(stop_signal=v1.Signal.SIGTERM), ["config.stop_signal"]),
    (
        create_with(mounts=[v1.Mount(container_path="/m", host_path="/h", uidMappings=[v1.IDMapping(length=1)])]),
        ["config.mounts[1].uidMappings"],
    ),
    (
        create_with(mounts=[v1.Mount(container_path="/img", image=v1.ImageSpec(image="data:1"))]),
        ["config.mounts[1].image"],
    ),
    (
        # advisory fields are not named even when something else is refused
        create_with(image=v1.ImageSpec(user_specified_image="busybox", image_ref="sha256:1"), stop_signal=v1.Signal.SIGKILL),
        ["config.stop_signal"],
    ),
    (
        create_with(CDI_devices=[v1.CDIDevice(name="x")], stop_signal=v1.Signal.SIGINT),
        ["config.CDI_devices", "config.stop_signal"],
    ),
]


@pytest.mark.parametrize(
    ("request_", "fields"), REFUSED, ids=["cdi", "rro", "supplemental-groups", "stop-signal", "idmap", "image-volume", "advisory+stop", "two"]
)
async def test_field_v1alpha2_cannot_carry_is_invalid_argument(old_backend, client, request_, fields) -> None:
    with pytest.raises(aio.AioRpcError) as err:
        await client.unary_unary(path("v1", "CreateContainer"))(request_.SerializeToString())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details()
    assert details.startswith("CreateContainer: the backend speaks CRI v1alpha2, which cannot carry ")
    assert f"cannot carry {', '.join(fields)};" in details
    assert "user_specified_image" not in details and "image_ref" not in details
    assert backend_paths(old_backend) == []


async def test_advisory_image_fields_are_forwarded(old_backend, client) -> None:
    pull = v1.PullImageRequest(
        image=v1.ImageSpec(image="docker.io/library/busybox:1", user_specified_image="busybox:1")
    ).SerializeToString()
    old_backend.script(path("v1alpha2", "PullImage", "ImageService"), echo=True)
    assert await client.unary_unary(path("v1", "PullImage", "ImageService"))(pull) == pull
    create = create_with(image=v1.ImageSpec(user_specified_image="busybox", image_ref="sha256:1")).SerializeToString()
    old_backend.script(path("v1alpha2", "CreateContainer"), response=b"")
    await client.unary_unary(path("v1", "CreateContainer"))(create)
    assert [(r.path, r.requests) for r in old_backend.received if not is_probe(r.path)] == [
        (path("v1alpha2", "PullImage", "ImageService"), [pull]),
        (path("v1alpha2", "CreateContainer"), [create]),
    ]


async def test_undecodable_request_is_left_to_the_backend(old_backend, client) -> None:
    garbage = b"\xff\xff\xff\xff"
    old_backend.script(path("v1alpha2", "CreateContainer"), code=grpc.StatusCode.INTERNAL, details="bad request")
    with pytest.raises(aio.AioRpcError) as err:
        await client.unary_unary(path("v1", "CreateContainer"))(garbage)
    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.INTERNAL, "bad request")
    assert old_backend.calls(path("v1alpha2", "CreateContainer"))[0].requests == [garbage]


async def test_v1alpha2_backend_answers_parse_as_v1(old_backend, client) -> None:
    old_backend.script(
        path("v1alpha2", "ContainerStatus"),
        response=v1alpha2.ContainerStatusResponse(
            status=v1alpha2.ContainerStatus(
                id="c1",
                metadata=v1alpha2.ContainerMetadata(name="app", attempt=2),
                state=v1alpha2.CONTAINER_RUNNING,
                image=v1alpha2.ImageSpec(image="busybox"),
                labels={"app": "web"},
                mounts=[v1alpha2.Mount(container_path="/d", host_path="/h", readonly=True)],
            ),
            info={"pid": "42"},
        ).SerializeToString(),
    )
    old_backend.script(
        path("v1alpha2", "ListImages", "ImageService"),
        response=v1alpha2.ListImagesResponse(
            images=[v1alpha2.Image(id="sha256:1", repo_tags=["busybox:1"], size=1234, uid=v1alpha2.Int64Value(value=0))]
        ).SerializeToString(),
    )
    status = v1.ContainerStatusResponse.FromString(
        await client.unary_unary(path("v1", "ContainerStatus"))(v1.ContainerStatusRequest(container_id="c1").SerializeToString())
    )
    assert status.status.id == "c1"
    assert status.status.metadata.attempt == 2
    assert status.status.state == v1.CONTAINER_RUNNING
    assert status.status.image.image == "busybox"
    assert dict(status.status.labels) == {"app": "web"}
    assert [(m.container_path, m.readonly, m.recursive_read_only) for m in status.status.mounts] == [("/d", True, False)]
    assert dict(status.info) == {"pid": "42"}
    images = v1.ListImagesResponse.FromString(await client.unary_unary(path("v1", "ListImages", "ImageService"))(b""))
    assert [(i.id, list(i.repo_tags), i.size, i.uid.value, i.HasField("uid")) for i in images.images] == [
        ("sha256:1", ["busybox:1"], 1234, 0, True)
    ]
    # The version a v1 client asks for is answered by the v1alpha2 runtime, as v1.
    version = v1.VersionResponse.FromString(await client.unary_unary(path("v1", "Version"))(b""))
    assert (version.runtime_name, version.runtime_api_version) == ("fake", "v1alpha2")


# --------------------------------------------------------------------------- bytes survive translation


def create_with_raw_env_and_unknown_field() -> bytes:
    request = common_create("v1")
    request.config.envs.append(v1.KeyValue(key="RAW", value=RAW_ENV))
    return request.SerializeToString() + UNKNOWN_FIELD


@pytest.mark.parametrize(
    ("versions", "client_version", "target"),
    [(ONLY_V1ALPHA2, "v1", "v1alpha2"), (ONLY_V1, "v1alpha2", "v1")],
    ids=["v1-client-to-v1alpha2", "v1alpha2-client-to-v1"],
)
async def test_non_utf8_env_and_unknown_fields_survive_byte_identically(
    proxy_for, client, caplog, versions, client_version, target
) -> None:
    """With unknown-fields: forward (for v1 -> v1alpha2; the other way they are always forwarded,
    since a v1 runtime may know what the v1alpha2 schema lacks)."""
    caplog.set_level(logging.WARNING, logger="runtimeproxy")
    fake, _ = await proxy_for(versions, serve_versions="v1,v1alpha2", forward_unknown=True)
    create = create_with_raw_env_and_unknown_field()
    assert RAW_ENV in create and create.endswith(UNKNOWN_FIELD)
    listing = v1.ListContainersRequest(filter=v1.ContainerFilter(id="abc")).SerializeToString() + UNKNOWN_FIELD
    reply = v1.ListContainersResponse(containers=[v1.Container(id="c1")]).SerializeToString() + UNKNOWN_FIELD
    fake.script(path(target, "CreateContainer"), echo=True)
    fake.script(path(target, "ListContainers"), response=reply)

    assert await client.unary_unary(path(client_version, "CreateContainer"))(create) == create
    assert await client.unary_unary(path(client_version, "ListContainers"))(listing) == reply
    assert fake.calls(path(target, "CreateContainer"))[0].requests == [create]
    assert fake.calls(path(target, "ListContainers"))[0].requests == [listing]
    # What arrived is still a v1 request with the raw value and the unknown field.
    arrived = v1.CreateContainerRequest.FromString(fake.calls(path(target, "CreateContainer"))[0].requests[0])
    assert [(e.key, e.value) for e in arrived.config.envs] == [("K", b"v"), ("RAW", RAW_ENV)]
    assert arrived.SerializeToString() == create
    # Each kind is logged once: a second CreateContainer of the same shape is not logged again.
    await client.unary_unary(path(client_version, "CreateContainer"))(create)
    warnings = [(r.method, r.fields) for r in caplog.records if r.getMessage().startswith("forwarding fields unknown")]
    if target == "v1alpha2":
        assert warnings == [("CreateContainer", ["#999"]), ("ListContainers", ["#999"])]
    else:
        assert warnings == []


async def test_fields_unknown_to_the_proxy_are_refused_for_a_v1alpha2_runtime(proxy_for, client) -> None:
    fake, _ = await proxy_for(ONLY_V1ALPHA2, serve_versions="v1,v1alpha2")
    security = v1.LinuxContainerSecurityContext(run_as_username="u").SerializeToString() + UNKNOWN_FIELD
    request = common_create("v1")
    request.config.linux.security_context.MergeFromString(security)
    with pytest.raises(aio.AioRpcError) as err:
        await client.unary_unary(path("v1", "CreateContainer"))(request.SerializeToString())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "config.linux.security_context.#999" in err.value.details()
    assert "unknown-fields: forward" in err.value.details()
    # Also in requests that cannot carry a v1-only field, and as enum values.
    with pytest.raises(aio.AioRpcError) as err:
        await client.unary_unary(path("v1", "ListContainers"))(
            v1.ListContainersRequest(filter=v1.ContainerFilter(state=v1.ContainerStateValue(state=9))).SerializeToString()
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "filter.state.state=9" in err.value.details()
    assert backend_paths(fake) == []


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


# --------------------------------------------------------------------------- the assembled app


async def test_the_app_refuses_and_forwards_like_the_router(backend, client, sock_dir) -> None:
    """build_proxy wires the v1-only field check in front of the hooks."""
    fake = await backend(ONLY_V1ALPHA2)
    hook_dir = sock_dir / "hooks.d"
    hook_dir.mkdir(mode=0o755)
    config = ProxyConfig(
        listen=sock_dir / "proxy.sock", backend=fake.socket, hook_dir=hook_dir, serve_versions="v1,v1alpha2"
    )
    async with contextlib.AsyncExitStack() as stack:
        running = await build_proxy(config, stack)
        await running.proxy.wait_ready(10)
        with pytest.raises(aio.AioRpcError) as err:
            await client.unary_unary(path("v1", "CreateContainer"))(
                create_with(stop_signal=v1.Signal.SIGTERM).SerializeToString()
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "config.stop_signal" in err.value.details()
        fake.script(
            path("v1alpha2", "CreateContainer"),
            response=v1alpha2.CreateContainerResponse(container_id="ctr-1").SerializeToString(),
        )
        ok = create_with(image=v1.ImageSpec(image="busybox", user_specified_image="busybox"))
        reply = await client.unary_unary(path("v1", "CreateContainer"))(ok.SerializeToString())
        assert v1.CreateContainerResponse.FromString(reply).container_id == "ctr-1"
        [received] = fake.calls(path("v1alpha2", "CreateContainer"))
        assert v1.CreateContainerRequest.FromString(received.requests[0]) == ok
        assert fake.calls(path("v1", "CreateContainer")) == []
        # unknown-fields defaults to refuse.
        with pytest.raises(aio.AioRpcError) as err:
            await client.unary_unary(path("v1", "CreateContainer"))(ok.SerializeToString() + UNKNOWN_FIELD)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "#999" in err.value.details()


async def test_the_app_forwards_unknown_fields_when_told(backend, client, sock_dir) -> None:
    fake = await backend(ONLY_V1ALPHA2)
    hook_dir = sock_dir / "hooks.d"
    hook_dir.mkdir(mode=0o755)
    config = ProxyConfig(
        listen=sock_dir / "proxy.sock", backend=fake.socket, hook_dir=hook_dir, serve_versions="v1", unknown_fields="forward",
    )
    fake.script(path("v1alpha2", "StopContainer"), echo=True)
    request = v1.StopContainerRequest(container_id="c1").SerializeToString() + UNKNOWN_FIELD
    async with contextlib.AsyncExitStack() as stack:
        running = await build_proxy(config, stack)
        await running.proxy.wait_ready(10)
        assert await client.unary_unary(path("v1", "StopContainer"))(request) == request
    assert fake.calls(path("v1alpha2", "StopContainer"))[0].requests == [request]


async def test_a_request_with_thousands_of_refused_fields_gets_a_short_answer(proxy_for, client) -> None:
    """One entry per kind of field, at most ten kinds: the answer fits in a gRPC status."""
    await proxy_for(ONLY_V1ALPHA2, serve_versions="v1,v1alpha2")
    request = common_create("v1")
    for i in range(2000):
        request.config.mounts.add(container_path=f"/m{i}", propagation=7)
    raw = request.SerializeToString()
    with pytest.raises(aio.AioRpcError) as err:
        await client.unary_unary(path("v1", "CreateContainer"))(raw)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "config.mounts[1].propagation=7 (+1999 like it)" in err.value.details()  # [0]: common_create's own
    assert len(err.value.details()) < 400
