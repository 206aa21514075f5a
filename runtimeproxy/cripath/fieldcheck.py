"""Refusing what an older backend cannot carry.

A v1 request sent on to a v1alpha2-only runtime keeps its bytes; fields that
v1alpha2 does not know would be silently ignored there, and some of them are
security settings (supplemental groups policy, recursive read-only mounts).
Such a request is refused with INVALID_ARGUMENT naming the fields, also when
a string in it is not UTF-8 (parsed then as :mod:`.lenient`'s twin of v1).

So is, by default, a request carrying what even our v1 schema lacks (a
kubelet newer than the proxy): v1alpha2 cannot know it either. An operator who
prefers to run such a kubelet anyway sets ``unknown-fields: forward``; each
new kind of unknown field is then logged once, as a warning.
"""

from __future__ import annotations

import logging
import re
from collections import Counter

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from . import lenient, methods, schemadiff
from .methods import ApiVersion
from .stage import Send, Stage, StageProvider

log = logging.getLogger(__name__)

# v1-only fields that only inform (ImageSpec's name as the user wrote it, the
# resolved ref): a v1alpha2 runtime works the same without them, and kubelet
# sets them on nearly every CreateContainer and PullImage. Everything else
# v1alpha2 cannot carry is refused.
ADVISORY_FIELDS = frozenset({"user_specified_image", "image_ref"})
_WARNED_LIMIT = 1000  # distinct unknown-field shapes warned about, at most


def refused_fields(fields: list[str]) -> list[str]:
    return [f for f in fields if f.rsplit(".", 1)[-1] not in ADVISORY_FIELDS]


def _shape(path: str) -> str:
    """A path without its list indexes and map keys: what to warn about once."""
    return re.sub(r"\[[^\]]*\]", "[]", path)


def summarize(paths: list[str], kinds: int = 10) -> list[str]:
    """Paths for an error or a log line: one per shape (``mounts[0].x (+9 like it)``),
    at most ``kinds`` of them, so that a request with thousands of them still
    gets a readable answer that fits in gRPC's status."""
    first: dict[str, str] = {}
    count: Counter[str] = Counter()
    for path in paths:
        shape = _shape(path)
        first.setdefault(shape, path)
        count[shape] += 1
    out = [first[s] + (f" (+{count[s] - 1} like it)" if count[s] > 1 else "") for s in list(first)[:kinds]]
    if len(first) > kinds:
        out.append(f"and {len(first) - kinds} more kinds")
    return out


class V1OnlyFieldCheck(StageProvider):
    def __init__(self, forward_unknown: bool = False) -> None:
        self.forward_unknown = forward_unknown
        self._warned: set[tuple[str, str]] = set()

    def stage_for(self, method: str, client_version: str, backend_version: str) -> Stage | None:
        if not (client_version == ApiVersion.V1 and backend_version == ApiVersion.V1ALPHA2):
            return None
        info = next((i for i in methods.METHODS[ApiVersion.V1].values() if i.name == method), None)
        if info is None:
            return None
        request_type = info.request
        may_carry_v1_only = schemadiff.request_needs_check(method)

        async def check(request: bytes, context: aio.ServicerContext, send: Send) -> bytes:
            try:  # a non-UTF-8 string is no reason to skip the check: parsed as the lenient twin
                msg = lenient.parse(request_type, request)
            except DecodeError:  # not a valid request at all: let the backend judge the bytes
                return await send(request)
            fields = summarize(refused_fields(schemadiff.v1_only_fields(msg))) if may_carry_v1_only else []
            if fields:
                log.info("refusing fields v1alpha2 cannot carry", extra={"method": method, "fields": fields})
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{method}: the backend speaks CRI v1alpha2, which cannot carry "
                    f"{', '.join(fields)}; refusing rather than dropping them",
                )
            unknown = schemadiff.unknown_to_schema(msg)
            if unknown:
                self._unknown(method, unknown)
                if not self.forward_unknown:
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"{method}: carries {', '.join(summarize(unknown))}, unknown to runtime-proxy's CRI v1 schema "
                        f"and so to the backend's CRI v1alpha2; refusing rather than dropping them "
                        f"(setting unknown-fields: forward sends them on)",
                    )
            return await send(request)

        return check

    def _unknown(self, method: str, paths: list[str]) -> None:
        if not self.forward_unknown:
            log.info("refusing fields unknown to this proxy", extra={"method": method, "fields": summarize(paths)})
            return
        new = {(method, _shape(p)) for p in paths} - self._warned
        if new and len(self._warned) < _WARNED_LIMIT:
            self._warned |= new
            log.warning(
                "forwarding fields unknown to this proxy; the v1alpha2 runtime will ignore them",
                extra={"method": method, "fields": summarize(paths)},
            )
