"""Issue: CRI v1alpha2 <-> v1 translation: the bytes of a request survive it
(non-UTF-8 values; unknown fields, forwarded when told), and fields unknown to
the proxy are refused for a v1alpha2 runtime otherwise; a non-UTF-8 string
(which v1 cannot parse) skips neither that nor the v1-only field check."""

from __future__ import annotations

import logging

import grpc
import pytest
from google.protobuf.message import DecodeError
from grpc import aio

from cri_api.v1 import api_pb2 as v1

from . import translationcases
from .translationcases import (
    ONLY_V1,
    ONLY_V1ALPHA2,
    UNKNOWN_FIELD,
    backend_paths,
    common_create,
    create_with,
    path,
)

backend = translationcases.backend  # the fixtures, here for pytest (and the grpcpath mirror) to find
proxy_for = translationcases.proxy_for

RAW_ENV = b"\xff\xfe"  # not UTF-8: a v1 bytes value, a v1alpha2 string on the wire


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


PLACEHOLDER = b"PLACEHOLDER"
NOT_UTF8 = b"\xff\xfe" + b"\x80" * (len(PLACEHOLDER) - 2)  # same length: the framing stays valid


def with_non_utf8_labels(request: v1.CreateContainerRequest | v1.RunPodSandboxRequest) -> bytes:
    """``request``'s bytes with a label key and value and an annotation value that are not UTF-8."""
    request.config.labels[PLACEHOLDER.decode()] = PLACEHOLDER.decode()
    request.config.annotations["a"] = PLACEHOLDER.decode()
    raw = request.SerializeToString().replace(PLACEHOLDER, NOT_UTF8)
    with pytest.raises(DecodeError):
        type(request).FromString(raw)  # upb: "String field had bad UTF-8"
    return raw


NON_UTF8_REFUSED = [
    (
        "CreateContainer",
        create_with(
            linux=v1.LinuxContainerConfig(
                security_context=v1.LinuxContainerSecurityContext(supplemental_groups_policy=v1.Strict)
            )
        ),
        "cannot carry config.linux.security_context.supplemental_groups_policy;",
    ),
    (
        "CreateContainer",
        create_with(mounts=[v1.Mount(container_path="/ro", host_path="/h", readonly=True, recursive_read_only=True)]),
        "cannot carry config.mounts[1].recursive_read_only;",
    ),
    (
        "RunPodSandbox",
        v1.RunPodSandboxRequest(
            config=v1.PodSandboxConfig(
                metadata=v1.PodSandboxMetadata(name="web", uid="u", namespace="default"),
                linux=v1.LinuxPodSandboxConfig(
                    security_context=v1.LinuxSandboxSecurityContext(supplemental_groups_policy=v1.Strict)
                ),
            )
        ),
        "cannot carry config.linux.security_context.supplemental_groups_policy;",
    ),
    ("CreateContainer", create_with(stop_signal=v1.Signal.SIGTERM), "cannot carry config.stop_signal;"),
]


@pytest.mark.parametrize(
    ("method", "request_", "named"), NON_UTF8_REFUSED, ids=["supplemental-groups", "rro", "sandbox", "stop-signal"]
)
async def test_a_non_utf8_string_does_not_skip_the_v1_only_field_check(proxy_for, client, method, request_, named) -> None:
    """v1 cannot parse the bytes (a string is not UTF-8); the check reads them as v1's lenient twin."""
    fake, _ = await proxy_for(ONLY_V1ALPHA2, serve_versions="v1,v1alpha2")
    with pytest.raises(aio.AioRpcError) as err:
        await client.unary_unary(path("v1", method))(with_non_utf8_labels(request_))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"{method}: the backend speaks CRI v1alpha2, which ")
    assert named in err.value.details()
    assert backend_paths(fake) == []


async def test_a_non_utf8_string_does_not_skip_the_unknown_field_check(proxy_for, client) -> None:
    fake, _ = await proxy_for(ONLY_V1ALPHA2, serve_versions="v1,v1alpha2")
    raw = with_non_utf8_labels(common_create("v1")) + UNKNOWN_FIELD
    with pytest.raises(aio.AioRpcError) as err:
        await client.unary_unary(path("v1", "CreateContainer"))(raw)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "carries #999, unknown to runtime-proxy's CRI v1 schema" in err.value.details()
    assert backend_paths(fake) == []


async def test_a_non_utf8_request_without_v1_only_fields_is_forwarded_byte_identically(proxy_for, client) -> None:
    fake, _ = await proxy_for(ONLY_V1ALPHA2, serve_versions="v1,v1alpha2")
    # advisory fields are forwarded, as without the non-UTF-8 strings
    request = common_create("v1")
    request.config.image.user_specified_image = "busybox"
    raw = with_non_utf8_labels(request)
    fake.script(path("v1alpha2", "CreateContainer"), echo=True)
    assert await client.unary_unary(path("v1", "CreateContainer"))(raw) == raw
    assert fake.calls(path("v1alpha2", "CreateContainer"))[0].requests == [raw]
