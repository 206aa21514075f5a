"""Refusing what an older backend cannot carry.

A v1 request sent on to a v1alpha2-only runtime keeps its bytes; fields that
v1alpha2 does not know would be silently ignored there, and some of them are
security settings (supplemental groups policy, recursive read-only mounts).
Such a request is refused with INVALID_ARGUMENT naming the fields. Requests
whose type cannot hold any v1-only field are never decoded.
"""

from __future__ import annotations

import logging

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from . import convert
from .convert import ApiVersion
from .router import Send, Stage, StageProvider

log = logging.getLogger(__name__)

# v1-only fields that only inform (ImageSpec's name as the user wrote it, the
# resolved ref): a v1alpha2 runtime works the same without them, and kubelet
# sets them on nearly every CreateContainer and PullImage. Everything else
# v1alpha2 cannot carry is refused.
ADVISORY_FIELDS = frozenset({"user_specified_image", "image_ref"})


def refused_fields(fields: list[str]) -> list[str]:
    return [f for f in fields if f.rsplit(".", 1)[-1] not in ADVISORY_FIELDS]


class V1OnlyFieldCheck(StageProvider):
    def stage_for(self, method: str, client_version: str, backend_version: str) -> Stage | None:
        if not (client_version == ApiVersion.V1 and backend_version == ApiVersion.V1ALPHA2):
            return None
        if not convert.request_needs_check(method):
            return None
        info = next(i for i in convert.METHODS[ApiVersion.V1].values() if i.name == method)
        request_type = info.request

        async def check(request: bytes, context: aio.ServicerContext, send: Send) -> bytes:
            try:
                fields = refused_fields(convert.v1_only_fields(request_type.FromString(request)))
            except DecodeError:  # not a valid request: let the backend judge the bytes
                return await send(request)
            if fields:
                log.info("refusing fields v1alpha2 cannot carry", extra={"method": method, "fields": fields})
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{method}: the backend speaks CRI v1alpha2, which cannot carry "
                    f"{', '.join(fields)}; refusing rather than dropping them",
                )
            return await send(request)

        return check
