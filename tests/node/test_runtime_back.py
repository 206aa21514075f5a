"""kubelet's connection made during a runtime outage goes back to the frames path.

On the frames data path a connection accepted while containerd cannot be
dialled is spliced to the proxy's own grpc.aio server; once containerd is
back the proxy tells it to go away (a GOAWAY NO_ERROR, last stream 2^31-1,
frames/splice.py). This checks that a real kubelet (grpc-go) takes that as
meant: it redials, its next connection is relayed, no call of it fails for
it, and a pod started afterwards runs.

The order that gives a spliced kubelet connection: kubelet connected
(relayed), containerd stopped: the proxy loses the runtime, the relayed
connection ends with it, and kubelet's redial during the outage is spliced.
(Not kubelet started during the outage: its start checks the runtime with a
Version call, remote_runtime.go's validateServiceConnection, and fails
without an answer.) The tier's own containerd is not touched: this test
stops and restarts a containerd of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.host.process import HostProcessError

from . import runtime
from .manifests import AFTER_OUTAGE
from .noderun import NodeRun
from .proxyproc import ProxyProcess

pytestmark = pytest.mark.asyncio(loop_scope="session")
log = logging.getLogger(__name__)

START_TIMEOUT = 60.0
OUTAGE_TIMEOUT = 30.0  # kubelet redials within its grpc-go backoff (1 s, growing to 2 min: a few steps here)
BACK_TIMEOUT = 30.0
CONNECTIONS = "runtime_proxy_frames_connections_total"
OPEN = "runtime_proxy_frames_connections_open"
TOLD = "connections made while the runtime could not be reached are told to reconnect, to be relayed"
# What grpc-go says of a call its connection failed (a GOAWAY it took for an
# error, a transport closed under a call), as kubelet logs it.
TRANSPORT_TROUBLE = re.compile(r"connection error|transport is closing|the connection is draining|"
                               r"error reading from server|GOAWAY|received prior goaway", re.IGNORECASE)


@dataclass
class OutageNode:
    containerd: LocalContainerd
    proxy: ProxyProcess
    run: NodeRun


@pytest_asyncio.fixture(loop_scope="session")
async def outage_node(kubelet_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OutageNode]:
    """A containerd of its own, the proxy on the frames path, kubelet with no pod yet."""
    base = tmp_path_factory.mktemp("node-runtime-back")
    hook_dir = base / "hooks.d"
    hook_dir.mkdir(mode=0o755)
    async with contextlib.AsyncExitStack() as stack:
        containerd = LocalContainerd(base / "containerd")
        stack.push_async_callback(containerd.stop)
        try:
            await containerd.start(timeout=START_TIMEOUT)
        except HostProcessError as exc:
            pytest.fail(f"could not start containerd: {exc}", pytrace=False)
        proxy = ProxyProcess(base, containerd.socket, hook_dir, ("--data-path", "frames"))
        stack.push_async_callback(proxy.stop)
        await proxy.start()
        run = await stack.enter_async_context(
            NodeRun(kubelet_binary, base / "kubelet", containerd, proxy.socket, pods=()))
        yield OutageNode(containerd, proxy, run)


async def _connections(proxy: ProxyProcess, name: str = CONNECTIONS) -> dict[str, float]:
    """Frames connections by path: made so far, or open now (``OPEN``)."""
    samples = (await proxy.metrics()).get(name, {})
    return {dict(labels)["path"]: value for labels, value in samples.items()}


def _told(proxy: ProxyProcess) -> dict | None:
    return next((r for r in proxy.log_records() if r.get("msg") == TOLD), None)


async def test_kubelet_spliced_in_an_outage_comes_back_relayed(outage_node: OutageNode) -> None:
    node, kubelet = outage_node, outage_node.run.kubelet
    pid = kubelet.pid

    async def relayed_at_least(n: float) -> dict[str, float] | None:
        counts = await _connections(node.proxy)
        return counts if counts.get("relayed", 0) >= n else None

    before = await runtime.wait_for("kubelet's first connection relayed", lambda: relayed_at_least(1), START_TIMEOUT)
    assert before.get("spliced", 0) == 0, before

    await node.containerd.stop()

    async def spliced() -> dict[str, float] | None:
        counts = await _connections(node.proxy)
        return counts if counts.get("spliced", 0) >= 1 else None

    during = await runtime.wait_for("kubelet redialled during the outage, spliced", spliced, OUTAGE_TIMEOUT)
    assert _told(node.proxy) is None, "told to reconnect while the runtime was still down"

    await node.containerd.start(timeout=START_TIMEOUT, images=False)

    async def told() -> dict | None:
        return _told(node.proxy)

    record = await runtime.wait_for("the proxy told the spliced connections to reconnect", told, BACK_TIMEOUT)
    # From here on the GOAWAY is on kubelet's side: whatever it does with it shows after this cut.
    log_cut = len(kubelet.log_text())
    _, failed_at_goaway = await kubelet.runtime_operations()
    assert record["connections"] >= 1, record

    # kubelet closes the spliced connection (grpc-go does once a GOAWAY's streams are done)...
    async def splice_closed() -> dict[str, float] | None:
        open_now = await _connections(node.proxy, OPEN)
        return open_now if open_now.get("spliced", 0) == 0 else None

    await runtime.wait_for("kubelet closed its spliced connection after the GOAWAY", splice_closed, BACK_TIMEOUT)
    # ... and its next connection is relayed.
    after = await runtime.wait_for(
        "kubelet's connection after the GOAWAY relayed",
        lambda: relayed_at_least(during.get("relayed", 0) + 1), BACK_TIMEOUT)

    node.run.pods = (AFTER_OUTAGE,)
    AFTER_OUTAGE.write(kubelet.manifests)
    pods = await node.run.wait_running()
    container = pods[node.run.pod_name(AFTER_OUTAGE)].containers["main"]
    async with node.run.channel() as channel:
        container_pid = await runtime.container_pid(channel, container.id)
    assert os.path.exists(f"/proc/{container_pid}"), f"the container's process {container_pid} is not running"

    _, failed = await kubelet.runtime_operations()
    new_failures = {op: n - failed_at_goaway.get(op, 0) for op, n in failed.items() if n > failed_at_goaway.get(op, 0)}
    trouble = [line[:400] for line in kubelet.log_text()[log_cut:].splitlines() if TRANSPORT_TROUBLE.search(line)]
    log.info("runtime back: connections %s before the outage, %s during, %s after; told %d",
             before, during, after, record["connections"])
    assert new_failures == {}, f"kubelet calls failed after the GOAWAY: {new_failures}\n{kubelet.log_tail()}"
    assert trouble == [], "kubelet logged transport errors after the GOAWAY:\n" + "\n".join(trouble)
    assert kubelet.pid == pid, "kubelet restarted"
    final = await _connections(node.proxy)
    assert final.get("spliced", 0) == during["spliced"], f"spliced again after the runtime was back: {final}"
