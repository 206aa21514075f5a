"""The SDK serves exactly the hook points of the registry, and the registry
matches the wire contract (the generated RuntimeHookService descriptor)."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest
from google.protobuf.message import DecodeError

from cri_api.hookapi import api_pb2
from hooks.sdk import HookServer, service_handlers
from runtimeproxy.hookpath.points import HOOK_POINTS, SERVICE_NAME, HookType


@dataclass
class CallDetails:
    method: str
    invocation_metadata: tuple = ()


def test_sdk_servicer_serves_exactly_the_registry() -> None:
    handlers = service_handlers(HookServer("/tmp/never-started.sock"))
    assert set(handlers) == {point.rpc_name for point in HOOK_POINTS.values()}
    assert len(handlers) == len(HookType)
    for point in HOOK_POINTS.values():
        handler = handlers[point.rpc_name]
        assert not handler.request_streaming and not handler.response_streaming
        # The point's request type, decoded (a wrapper that logs an undecodable one: hooks.calllog).
        request = point.request_type()
        request.pod_meta.name = "p"
        assert handler.request_deserializer(request.SerializeToString()) == request, point.hook
        with pytest.raises(DecodeError):
            handler.request_deserializer(b"\xff\xff\xff")
        assert handler.response_serializer == point.response_type.SerializeToString, point.hook

    # What grpc routes: every full method of the registry, nothing else.
    generic = grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)
    for point in HOOK_POINTS.values():
        assert generic.service(CallDetails(point.full_method)) is handlers[point.rpc_name]
    assert generic.service(CallDetails(f"/{SERVICE_NAME}/PreRemovePodSandboxHook")) is None


def test_registry_matches_the_generated_service_descriptor() -> None:
    (service,) = [s for s in api_pb2.DESCRIPTOR.services_by_name.values() if s.full_name == SERVICE_NAME]
    methods = {m.name: m for m in service.methods}
    assert set(methods) == {point.rpc_name for point in HOOK_POINTS.values()}
    for point in HOOK_POINTS.values():
        method = methods[point.rpc_name]
        assert f"/{service.full_name}/{method.name}" == point.full_method
        assert method.input_type is point.request_type.DESCRIPTOR, point.hook
        assert method.output_type is point.response_type.DESCRIPTOR, point.hook
        assert not method.client_streaming and not method.server_streaming


def test_every_hook_point_has_its_sdk_handler() -> None:
    for point in HOOK_POINTS.values():
        assert callable(getattr(HookServer, point.handler_name)), point.hook
