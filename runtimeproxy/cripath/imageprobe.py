"""Whether an image service serves, and in which CRI versions: the probe
imagewatch.py asks at each READY of its channel.

ImageFsInfo (v1 and v1alpha2 at once, under one timeout, the runtime
probe's PROBE_TIMEOUT; ImageService has no Version), as cheap an image call
as there is. v1alpha2 is first asked by a method that does not exist
(registered.py: containerd 1.7 records a deprecation at a real v1alpha2
call, a false alarm on a node whose kubelet speaks v1 only); grpc-go's
"unknown service" is believed at once, its "there" once v1's ImageFsInfo
answered (or failed "not initialized": v1alpha2 is taken to fail alike)
within the first half of the timeout; else (or when the answer says
nothing) ImageFsInfo is asked in v1alpha2 too, in the rest of the same
timeout, and, v1alpha2 registered, v1's answer within the whole timeout
still tells unless that call answered first (a slow but healthy service:
the real call is dropped; a failure of the real call waits for v1's).
Each version's answer says whether the service has it (``versions``):
an answer, even an error, says yes; UNIMPLEMENTED "unknown service ..."
(grpc-go's word for a service not registered, as containerd sends) says no;
another UNIMPLEMENTED ("unknown method ...", "method ImageFsInfo not
implemented": the service is there without that call) says yes; one whose
message says neither (grpc-python's "Method not found!") leaves the version
unknown, taken to be there. "not initialized", UNAVAILABLE or
DEADLINE_EXCEEDED in a version leaves that version out; the service is down
when no version is there: one failed so, or both said "unknown service"
(whatever listens is no CRI image service: a wrong socket given).
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

import grpc
from grpc import aio

from .methods import ApiVersion
from .registered import Budget, registered
from .unready import NOT_INITIALIZED, not_initialized

PROBE_VERSIONS = (ApiVersion.V1, ApiVersion.V1ALPHA2)
NO_IMAGE_SERVICE = "ImageFsInfo (v1, v1alpha2): unknown service: no CRI ImageService listens there"


@dataclass(frozen=True)
class Probed:
    """A probe's outcome: why the service does not serve (None: it serves);
    the CRI versions taken to be there, and of those the ones ``unknown``
    (assumed there); ``failed``: while it serves, why the other versions
    did not answer (the probe is asked again)."""

    reason: str | None
    versions: frozenset[ApiVersion] = frozenset()
    unknown: frozenset[ApiVersion] = frozenset()
    failed: str | None = None
    failing: frozenset[ApiVersion] = frozenset()  # the versions ``failed`` names

    def __post_init__(self) -> None:
        if (self.failed is None) != (not self.failing):
            raise ValueError(f"failed ({self.failed!r}) and failing ({sorted(self.failing)}) must come together")


class _Found(enum.Enum):
    HAS = "has"
    LACKS = "lacks"
    UNKNOWN = "unknown"
    FAILED = "failed"


async def image_probe(channel: aio.Channel, timeout: float) -> Probed:
    """Whether the image service on ``channel`` serves, and in which versions:
    both asked at once, so one that hangs costs ``timeout``, not twice it."""
    first = asyncio.ensure_future(_ask(channel, ApiVersion.V1, timeout))
    second = asyncio.ensure_future(_ask_after(channel, first, Budget.of(timeout)))
    try:
        found = await asyncio.gather(first, second)
    finally:
        # Done, unless the probe was cancelled or one raised (not an RPC
        # error: e.g. the channel closed): the other must not run on.
        first.cancel()
        second.cancel()
    there = {v for v, (kind, _) in zip(PROBE_VERSIONS, found, strict=True) if kind in (_Found.HAS, _Found.UNKNOWN)}
    unknown = {v for v, (kind, _) in zip(PROBE_VERSIONS, found, strict=True) if kind is _Found.UNKNOWN}
    failures = {v: why for v, (kind, why) in zip(PROBE_VERSIONS, found, strict=True) if kind is _Found.FAILED}
    failed = _failures(failures)
    if failed is not None and not there:
        return Probed(failed)
    if not there:  # "unknown service" in both: whatever listens there is no CRI image service
        return Probed(NO_IMAGE_SERVICE)
    return Probed(None, frozenset(there), frozenset(unknown), failed, frozenset(failures))


async def _ask(channel: aio.Channel, version: ApiVersion, timeout: float) -> tuple[_Found, str]:
    """ImageFsInfo in ``version``: what it says of the version (and, FAILED, why)."""
    try:
        await channel.unary_unary(f"/{version.package}.ImageService/ImageFsInfo")(b"", timeout=timeout)
    except aio.AioRpcError as err:
        code, details = err.code(), err.details() or ""
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return _unimplemented(details), ""
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or not_initialized(
                code.value[0], details):
            return _Found.FAILED, f"{code.name}: {details}"
        # Any other error is the service's answer: the version is there.
    return _Found.HAS, ""


async def _ask_after(channel: aio.Channel, first: asyncio.Future[tuple[_Found, str]],
                     budget: Budget) -> tuple[_Found, str]:
    """v1alpha2, within ``budget``: first without a call of its own
    (registered.py: containerd 1.7 records a deprecation at a v1alpha2
    call). Not registered: lacking. Registered, and ``first`` (v1's
    ImageFsInfo) answered within the question's part: as ``_alike``.
    Otherwise (not told, v1 slow, hung, lacking or UNAVAILABLE) its
    ImageFsInfo, in the rest of the budget; registered, raced against v1's
    call still under way (a slow but healthy service answers v1 within the
    whole timeout, and v1alpha2 with it, though its own call would not),
    its failure waiting for v1's answer: v1's speed does not change the
    judgement."""
    there = await registered(channel, f"{ApiVersion.V1ALPHA2.package}.ImageService", budget.asking())
    if there is False:
        return _Found.LACKS, ""
    if not there:
        return await _ask(channel, ApiVersion.V1ALPHA2, budget.left())
    await asyncio.wait([first], timeout=budget.asking())
    if first.done():
        return _alike(first.result()) or await _ask(channel, ApiVersion.V1ALPHA2, budget.left())
    own = asyncio.ensure_future(_ask(channel, ApiVersion.V1ALPHA2, budget.left()))
    try:
        await asyncio.wait([first, own], return_when=asyncio.FIRST_COMPLETED)
        if not first.done() and own.result()[0] is _Found.FAILED:
            # As when v1 answers in time: a registered v1alpha2 is judged by
            # v1's answer, not by a failure of its own (v1's deadline ends this).
            await asyncio.wait([first])
        if first.done() and (verdict := _alike(first.result())) is not None:
            return verdict
        return await own
    finally:
        own.cancel()  # v1 told first: the real call's answer is not needed


def _alike(v1: tuple[_Found, str]) -> tuple[_Found, str] | None:
    """What v1's ImageFsInfo says of a registered v1alpha2 (containerd's two
    versions share one service): there if it answered, failing alike if not
    initialised; None: it does not tell (failed otherwise, or lacking)."""
    kind, why = v1
    if kind is _Found.HAS:
        return kind, ""
    if kind is _Found.FAILED and NOT_INITIALIZED in why:
        return kind, why
    return None


def _unimplemented(details: str) -> _Found:
    """grpc-go (containerd) says "unknown service X" when the version's service
    is not registered, "unknown method M for service X" or "method M not
    implemented" when it is; any other message tells nothing."""
    if details.startswith("unknown service "):
        return _Found.LACKS
    if details.startswith("unknown method ") or details.endswith(" not implemented"):
        return _Found.HAS
    return _Found.UNKNOWN


def _failures(failed: dict[ApiVersion, str]) -> str | None:
    """e.g. "ImageFsInfo (v1alpha2): DEADLINE_EXCEEDED: Deadline Exceeded";
    versions that failed alike share one part."""
    alike: dict[str, list[str]] = {}
    for version, why in failed.items():
        alike.setdefault(why, []).append(str(version))
    return "; ".join(f"ImageFsInfo ({', '.join(names)}): {why}" for why, names in alike.items()) or None
