"""Issue: CRI v1alpha2 <-> v1 translation in the assembled app: build_proxy puts the
v1-only field check in front of the hooks, refusing unknown fields unless told
to forward them, against a fake backend that serves v1alpha2 only."""

from __future__ import annotations

import contextlib

import grpc
import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1alpha2 import api_pb2 as v1alpha2
from runtimeproxy.app import build_proxy
from runtimeproxy.config import ProxyConfig

from . import translationcases
from .translationcases import ONLY_V1ALPHA2, UNKNOWN_FIELD, create_with, path

backend = translationcases.backend  # the fixture, here for pytest (and the grpcpath mirror) to find


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
