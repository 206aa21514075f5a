"""Issue: CRI v1alpha2 <-> v1 translation: a v1 client in front of a backend that
serves v1alpha2 only, and records what arrives: v1-only methods and fields are
refused, the rest is forwarded, and the answers parse as v1."""

from __future__ import annotations

import grpc
import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1alpha2 import api_pb2 as v1alpha2

from ..fakes import FakeBackend, is_probe
from . import translationcases
from .translationcases import (
    ONLY_V1ALPHA2,
    backend_paths,
    common_create,
    create_with,
    path,
)

backend = translationcases.backend  # the fixtures, here for pytest (and the grpcpath mirror) to find
proxy_for = translationcases.proxy_for


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
