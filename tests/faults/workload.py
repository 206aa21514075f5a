"""The client load of the kill tests: workers running pod lifecycles and reads,
and a ledger of what they know exists at the runtime.

A create or remove call that fails (the runtime or the proxy was killed under
it) leaves its object *uncertain*: the runtime may have done it or not, as for
a direct client. Everything else is *present* or *absent* for sure.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from runtimeproxy.host.crispec import container_config, pod_sandbox_config

PRESENT, ABSENT, UNCERTAIN = "present", "absent", "uncertain"
CALL_TIMEOUT = 30.0
# After an UNAVAILABLE, a worker waits this long before its next call: a
# client without the runtime must not turn into a busy loop that starves
# the restart on two cores.
RETRY_PAUSE = 0.05


@dataclass
class Ledger:
    """What the clients did: objects by pod uid (one container per pod), call outcomes."""

    pods: dict[str, str] = field(default_factory=dict)
    containers: dict[str, str] = field(default_factory=dict)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    # Pod uid -> (pod id, container id, pod config) of what a worker created.
    ids: dict[str, tuple[str, str, v1.PodSandboxConfig]] = field(default_factory=dict)
    succeeded: asyncio.Event = field(default_factory=asyncio.Event)
    # Set by a test that must know when a failure came: ``moment()`` is called
    # as each failure is recorded, and ``moments`` holds what it said, by status.
    moment: Callable[[], str] | None = None
    moments: dict[str, set[str]] = field(default_factory=dict)

    def codes(self) -> set[str]:
        return {code for (_, code) in self.outcomes if code != "OK"}

    def errors(self) -> set[str]:
        """The statuses ("CODE: details") of the failures other than UNAVAILABLE."""
        return {failure.split(": ", 1)[1] for failure in self.failures}

    def merged(self, other: Ledger) -> Ledger:
        """The objects of both (for comparing with the runtime's lists)."""
        return Ledger(pods=self.pods | other.pods, containers=self.containers | other.containers)

    def count(self, code: str = "OK") -> int:
        return sum(n for (_, c), n in self.outcomes.items() if c == code)


@dataclass(frozen=True)
class Listed:
    """What the runtime lists, keyed like the ledger."""

    pods: dict[str, str]  # pod uid -> sandbox id
    containers: dict[str, str]  # pod uid -> container id


async def listed(stub: v1_grpc.RuntimeServiceStub) -> Listed:
    sandboxes = (await stub.ListPodSandbox(v1.ListPodSandboxRequest(), timeout=CALL_TIMEOUT)).items
    uid_of = {s.id: s.metadata.uid for s in sandboxes}
    containers = (await stub.ListContainers(v1.ListContainersRequest(), timeout=CALL_TIMEOUT)).containers
    return Listed(pods={s.metadata.uid: s.id for s in sandboxes},
                  containers={uid_of[c.pod_sandbox_id]: c.id for c in containers if c.pod_sandbox_id in uid_of})


def mismatches(ledger: Ledger, runtime: Listed) -> list[str]:
    """Objects the ledger is sure of that the runtime disagrees with."""
    wrong = []
    for kind, mine, theirs in (("pod", ledger.pods, runtime.pods), ("container", ledger.containers, runtime.containers)):
        for uid, state in mine.items():
            if state == PRESENT and uid not in theirs:
                wrong.append(f"{kind} of pod uid {uid} was created and never removed, but is not listed")
            if state == ABSENT and uid in theirs:
                wrong.append(f"{kind} of pod uid {uid} was removed, but is listed")
        for uid in theirs.keys() - mine.keys():
            wrong.append(f"{kind} of pod uid {uid} is listed but no client made it")
    return wrong


class Worker:
    """One client: lifecycles with reads in between, until told to stop."""

    def __init__(self, name: str, stub: v1_grpc.RuntimeServiceStub, ledger: Ledger, log_dir: Path) -> None:
        self.name, self.stub, self.ledger, self.log_dir = name, stub, ledger, log_dir

    async def call(self, method: str, request: object) -> object | None:
        try:
            answer = await getattr(self.stub, method)(request, timeout=CALL_TIMEOUT)
        except aio.AioRpcError as exc:
            self.ledger.outcomes[(method, exc.code().name)] += 1
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                status = f"{exc.code().name}: {exc.details()}"
                self.ledger.failures.append(f"{self.name} {method}: {status}")
                if self.ledger.moment is not None:
                    self.ledger.moments.setdefault(status, set()).add(self.ledger.moment())
            await asyncio.sleep(RETRY_PAUSE)
            return None
        self.ledger.outcomes[(method, "OK")] += 1
        self.ledger.succeeded.set()
        return answer

    async def run(self, stop: asyncio.Event) -> None:
        round_ = 0
        while not stop.is_set():
            round_ += 1
            await self.one(round_, remove=round_ % 2 == 0)

    async def one(self, round_: int, remove: bool) -> None:
        led = self.ledger
        # Labels and annotations of its own, so hooks can be checked for the full pod data.
        pod_config = pod_sandbox_config(v1, self.log_dir, name=f"{self.name}-{round_}", labels={"worker": self.name},
                                        annotations={"round": str(round_)})
        uid = pod_config.metadata.uid
        led.pods[uid] = UNCERTAIN
        ran = await self.call("RunPodSandbox", v1.RunPodSandboxRequest(config=pod_config))
        if ran is None:
            return
        assert isinstance(ran, v1.RunPodSandboxResponse), ran
        pod_id = ran.pod_sandbox_id
        led.pods[uid], led.containers[uid] = PRESENT, UNCERTAIN
        created = await self.call("CreateContainer", v1.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=container_config(v1), sandbox_config=pod_config))
        if created is None:
            return
        assert isinstance(created, v1.CreateContainerResponse), created
        cid = created.container_id
        led.containers[uid] = PRESENT
        led.ids[uid] = (pod_id, cid, pod_config)
        await self.call("StartContainer", v1.StartContainerRequest(container_id=cid))
        await self.reads(pod_id, cid)
        if not remove:
            return
        await self.call("StopContainer", v1.StopContainerRequest(container_id=cid, timeout=5))
        led.containers[uid] = UNCERTAIN
        if await self.call("RemoveContainer", v1.RemoveContainerRequest(container_id=cid)) is not None:
            led.containers[uid] = ABSENT
        await self.call("StopPodSandbox", v1.StopPodSandboxRequest(pod_sandbox_id=pod_id))
        led.pods[uid] = UNCERTAIN
        if await self.call("RemovePodSandbox", v1.RemovePodSandboxRequest(pod_sandbox_id=pod_id)) is not None:
            led.pods[uid] = led.containers[uid] = ABSENT  # its containers go with it

    async def reads(self, pod_id: str, cid: str) -> None:
        await self.call("Version", v1.VersionRequest())
        await self.call("ListPodSandbox", v1.ListPodSandboxRequest())
        await self.call("ListContainers", v1.ListContainersRequest(filter=v1.ContainerFilter(pod_sandbox_id=pod_id)))
        await self.call("ContainerStatus", v1.ContainerStatusRequest(container_id=cid))
        await self.call("PodSandboxStatus", v1.PodSandboxStatusRequest(pod_sandbox_id=pod_id))


@contextlib.asynccontextmanager
async def load(stub: v1_grpc.RuntimeServiceStub, ledger: Ledger, log_dir: Path, clients: int = 16,
               name: str = "w"):
    """``clients`` workers on ``stub`` while the block runs; they finish their round after it."""
    stop = asyncio.Event()
    workers = [asyncio.create_task(Worker(f"{name}{i}", stub, ledger, log_dir).run(stop), name=f"fault-{name}{i}")
               for i in range(clients)]
    try:
        yield
    finally:
        stop.set()
        async with asyncio.timeout(120):
            await asyncio.gather(*workers)


async def progress(ledger: Ledger, calls: int) -> None:
    """Until ``calls`` more calls succeeded (the load really runs)."""
    target = ledger.count() + calls
    async with asyncio.timeout(60):
        while ledger.count() < target:
            ledger.succeeded.clear()
            await ledger.succeeded.wait()
