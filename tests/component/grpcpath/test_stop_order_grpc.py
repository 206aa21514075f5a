"""The stop ordering on the grpc data path, where a stop is issued by the grpc relay.

(On the frames path a hooked call's request is re-framed on the client's own
backend connection; the same ordering is the hook stage's, tested through
the suites on both paths.)
"""

from __future__ import annotations

import asyncio

import pytest

from cri_api.v1 import api_pb2 as v1

from ..hookpath.crirequests import STOP, UPDATE


async def test_a_stop_reaches_the_runtime_before_the_next_call_on_its_container(
    running, fake, client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop lets the next call on its container go once the stop is issued
    (handed to grpc), not merely scheduled: here the stop takes a few turns of
    the event loop before it is issued, and an update arrives meanwhile."""
    from .. import fakes

    arrivals: list[str] = []  # in the order the runtime's grpc server took the calls in
    real_service = fakes._Handler.service

    def service(self, details):  # type: ignore[no-untyped-def]
        arrivals.append(details.method)
        return real_service(self, details)

    monkeypatch.setattr(fakes._Handler, "service", service)
    update_waits = asyncio.Event()
    real_acquire = running.hooks.locks.acquire

    async def acquire(key: str):  # type: ignore[no-untyped-def]
        if running.hooks.locks.users(key):  # the stop holds it: the update is about to wait
            update_waits.set()
        return await real_acquire(key)

    relay = running.proxy.relay
    real_unary = relay.unary
    stop_in_relay = asyncio.Event()

    async def slow_to_issue(channel, path, request, context):  # type: ignore[no-untyped-def]
        if path.endswith("/StopContainer"):
            stop_in_relay.set()
            await update_waits.wait()  # e.g. a relay that awaits something before it issues a call
        return await real_unary(channel, path, request, context)

    running.hooks.locks.acquire = acquire  # type: ignore[method-assign]
    relay.unary = slow_to_issue  # type: ignore[method-assign]
    fake.script(STOP, hang=True)
    stop = asyncio.ensure_future(
        client.unary_unary(STOP)(v1.StopContainerRequest(container_id="ctr-1", timeout=600).SerializeToString(), timeout=10)
    )
    await asyncio.wait_for(stop_in_relay.wait(), 10)  # the stop holds its container's order
    update = v1.UpdateContainerResourcesRequest(container_id="ctr-1", linux=v1.LinuxContainerResources(cpu_quota=90000))
    await asyncio.wait_for(client.unary_unary(UPDATE)(update.SerializeToString(), timeout=10), 10)
    assert [path for path in arrivals if path in (STOP, UPDATE)] == [STOP, UPDATE]
    assert not stop.done()  # the update did not wait for the stop to end
    fake.scripts[STOP].release.set()
    await asyncio.wait_for(stop, 10)
