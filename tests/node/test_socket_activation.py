"""Socket activation under a real kubelet: restarting the proxy costs no call.

The test holds the proxy socket as systemd's runtime-proxy.socket would and
passes it to each proxy it starts (fd 3, LISTEN_FDS=1, LISTEN_PID). Across
restarts kubelet's connection attempts wait in the backlog; its own error
counter (kubelet_runtime_operations_errors_total) must not move.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from bench.procs import PROJECT_ROOT, Child
from runtimeproxy.host.containerd import LocalContainerd

from ..sockact import HeldSocket
from . import runtime
from .conftest import DATA_PATHS, ProxiedNode
from .noderun import NodeRun
from .proxyproc import ProxyProcess
from .test_kubelet import LIVE_PODS, RECOVERY_TIMEOUT, _kubelet_sees_running, _statuses

pytestmark = pytest.mark.asyncio(loop_scope="session")
log = logging.getLogger(__name__)

RESTARTS = 3


class ActivatedChild(Child):
    """The proxy process, started with the held socket as fd 3."""

    def __init__(self, child: Child, held: HeldSocket) -> None:
        super().__init__(child.name, held.wrap(child.argv), child.log_path)
        self._pass_fds = held.pass_fds

    async def start(self) -> None:
        with open(self.log_path, "ab") as log_file:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, cwd=PROJECT_ROOT, stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                start_new_session=True, pass_fds=self._pass_fds,
            )


@pytest_asyncio.fixture(scope="module", params=sorted(DATA_PATHS), loop_scope="session")
async def activated_node(request: pytest.FixtureRequest, kubelet_binary: Path, node_containerd: LocalContainerd,
                         direct_run: object, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ProxiedNode]:
    """kubelet through a socket-activated proxy (no hook servers: the socket is what is tested),
    on each data path. After the direct run, like the other variants: one kubelet at a time."""
    data_path: str = request.param
    base = tmp_path_factory.mktemp(f"node-activated-{data_path}")
    hook_dir = base / "hooks.d"
    hook_dir.mkdir(mode=0o755)
    async with contextlib.AsyncExitStack() as stack:
        proxy = ProxyProcess(base, node_containerd.socket, hook_dir, ("--data-path", data_path))
        held = HeldSocket(proxy.socket)
        stack.callback(held.close)
        proxy._child = ActivatedChild(proxy._child, held)
        stack.push_async_callback(proxy.stop)
        await proxy.start()
        run = await stack.enter_async_context(NodeRun(kubelet_binary, base / "kubelet", node_containerd, proxy.socket))
        await run.wait_running()
        yield ProxiedNode(f"activated-{data_path}", run, proxy, None, None, hook_dir)  # type: ignore[arg-type]


async def test_restarts_cost_kubelet_no_call(activated_node: ProxiedNode) -> None:
    node, kubelet = activated_node, activated_node.run.kubelet
    items = await _kubelet_sees_running(node, LIVE_PODS)
    counts = {(pod, c): s["restartCount"] for pod, item in items.items() for c, s in _statuses(item).items()}
    total_before, failed_before = await kubelet.runtime_operations()
    ok_before = sum(total_before.values()) - sum(failed_before.values())
    for _ in range(RESTARTS):
        await node.proxy.restart()
        assert any(r.get("msg") == "accepting on the socket from systemd" for r in node.proxy.log_records())

    async def settled() -> bool:
        # A few relists after the last restart: kubelet has used the new instance.
        total, _ = await kubelet.runtime_operations()
        return total.get("list_podsandbox", 0) >= total_before.get("list_podsandbox", 0) + 3 * (RESTARTS + 1)

    await runtime.wait_for("kubelet relisted after the restarts", settled, RECOVERY_TIMEOUT)
    items = await _kubelet_sees_running(node, LIVE_PODS)
    total, failed = await kubelet.runtime_operations()
    failed_calls = {op: n - failed_before.get(op, 0) for op, n in failed.items() if n - failed_before.get(op, 0)}
    ok_calls = sum(total.values()) - sum(failed.values()) - ok_before
    log.info("%d proxy restarts under kubelet with socket activation: %d calls ok, failed: %s",
             RESTARTS, ok_calls, failed_calls)
    assert failed_calls == {}, _failure_report(node, failed_calls)
    assert {(pod, c): s["restartCount"] for pod, item in items.items() for c, s in _statuses(item).items()} == counts
    noisy = [r for r in node.proxy.log_records() if r.get("level") in ("warning", "error", "critical")]
    assert not noisy, noisy


def _failure_report(node: ProxiedNode, failed_calls: dict[str, float]) -> str:
    """What kubelet said of its failed calls, beside the proxy's own account of
    its restarts: a failure here is rare, and CI keeps no logs."""
    errors = [line[:600] for line in node.run.kubelet.log_text().splitlines() if "rpc error" in line]
    proxy = [f"{r.get('time')} {r.get('msg')}" for r in node.proxy.log_records(all_starts=True)
             if r.get("level") != "debug"]
    return "\n".join([f"kubelet calls failed across the restarts: {failed_calls}",
                      "kubelet's errors:", *errors[-20:], "the proxy's log:", *proxy[-80:]])
