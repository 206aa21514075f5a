"""Fixtures of the node tier: a real kubelet (static pods) through the proxy, on a private containerd.

One containerd serves the whole tier. Each proxy variant gets one kubelet,
shared by the tests of the module (they read the same running node, in file
order); a direct run (kubelet straight at containerd) is made once, for the
error comparison. Everything runs on the session's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from runtimeproxy.hookpath.points import HookType
from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.host.process import HostProcessError

from ..hookprocs import HookProcess, hook_server
from ..integration.batchhelpers import HookRun, batchresource_hook
from ..integration.conftest import require_local_containerd
from ..prerequisites import fail_or_skip
from .binary import KubeletBinaryError, archive_path, unpacked_kubelet
from .crierrors import CriError, cri_errors
from .kubelet import read_sysctls
from .manifests import DOOMED
from .noderun import NodeRun
from .proxyproc import ProxyProcess

START_TIMEOUT = 60.0

# Proxy flags per variant. kubelet 1.26 speaks CRI v1 only (it has no v1alpha2
# client at all), so the translated path meets it with the proxy translating
# its v1 calls for a v1alpha2 backend; `--serve-versions v1alpha2` it refuses
# (test_v1alpha2_only.py).
# Each also runs on the frames data path (issue 14's differential: the same
# tests, the same results): `-frames` is the variant with `--data-path frames`.
_BASE_VARIANTS = {
    "v1": ("--serve-versions", "auto"),
    "v1-to-v1alpha2": ("--serve-versions", "auto", "--backend-version", "v1alpha2"),
}
DATA_PATHS = {"grpc": "", "frames": "-frames"}  # --data-path -> the variant name's suffix
VARIANTS = {
    name + suffix: (*flags, "--data-path", path)
    for name, flags in _BASE_VARIANTS.items()
    for path, suffix in DATA_PATHS.items()
}
ALL_HOOKS = [h.value for h in HookType]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "node: runs a real kubelet (root, containerd, the shared kubelet binary)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `-m "not node"` leaves the kubelet out; the harness's own unit tests still run.
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents and "kubelet_binary" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.node)


@pytest.fixture(scope="session")
def kubelet_binary(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared kubelet, unpacked and checked (cached across runs by its sha256)."""
    require_local_containerd()
    if shutil.which("unshare") is None:
        fail_or_skip("the node tier needs `unshare` (util-linux) for kubelet's private mount namespace")
    archive = archive_path(os.environ)
    if not archive.is_file():
        fail_or_skip(f"the node tier needs the kubelet archive {archive} (set RUNTIME_PROXY_SHARED)")
    cache = getattr(request.config, "cache", None)  # none under `-p no:cacheprovider`
    directory = Path(cache.mkdir("kubelet")) if cache is not None else tmp_path_factory.mktemp("kubelet")
    try:
        return unpacked_kubelet(archive, directory)
    except KubeletBinaryError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def node_containerd(kubelet_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalContainerd]:
    """The tier's own containerd: kubelet would take any other pods in it for orphans and kill them."""
    runtime = LocalContainerd(tmp_path_factory.mktemp("node-containerd"))
    try:
        try:
            await runtime.start(timeout=START_TIMEOUT)
        except HostProcessError as exc:
            pytest.fail(f"could not start containerd: {exc}", pytrace=False)
        yield runtime
    finally:
        await runtime.stop()


@pytest.fixture(scope="session")
def host_sysctls() -> dict[str, str]:
    """The host's values of the sysctls kubelet sets, read before any kubelet of the tier ran."""
    return read_sysctls()


@dataclass(frozen=True)
class DirectRun:
    """What kubelet did straight at containerd, in the same scenario."""

    errors: frozenset[CriError]
    running_s: float
    removal_s: float


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def direct_run(kubelet_binary: Path, node_containerd: LocalContainerd, host_sysctls: dict[str, str],
                     tmp_path_factory: pytest.TempPathFactory) -> DirectRun:
    """The scenario once without the proxy: pods running, one manifest removed."""
    async with NodeRun(kubelet_binary, tmp_path_factory.mktemp("direct"), node_containerd,
                       node_containerd.socket) as run:
        await run.wait_running()
        running_s = asyncio.get_running_loop().time() - run.started_at
        removal_s = await run.remove(DOOMED)
        return DirectRun(frozenset(cri_errors(run.kubelet.log_text())), running_s, removal_s)


@dataclass
class ProxiedNode:
    variant: str
    run: NodeRun
    proxy: ProxyProcess
    recorder: HookProcess  # the test hook server, on every hook point
    batch: HookRun  # `runtime-proxy hook run batchresource`
    hook_dir: Path


@pytest_asyncio.fixture(scope="module", params=sorted(VARIANTS), loop_scope="session")
async def proxied_node(request: pytest.FixtureRequest, kubelet_binary: Path, node_containerd: LocalContainerd,
               direct_run: DirectRun, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ProxiedNode]:
    """kubelet through a proxy process with two hook servers; the tier's pods written.

    After the direct run: two kubelets on one runtime would each take the
    other's pods for orphans and kill them."""
    variant: str = request.param
    base = tmp_path_factory.mktemp(f"node-{variant}")
    hook_dir = base / "hooks.d"
    hook_dir.mkdir(mode=0o755)
    async with contextlib.AsyncExitStack() as stack:
        recorder = await stack.enter_async_context(hook_server(base, "recorder", {}))
        recorder.register(hook_dir, ALL_HOOKS, failure_policy="Fail", timeout="5s")  # Fail: a hook error shows
        batch = await stack.enter_async_context(batchresource_hook(base, hook_dir))
        proxy = ProxyProcess(base, node_containerd.socket, hook_dir, VARIANTS[variant])
        stack.push_async_callback(proxy.stop)
        await proxy.start()
        assert await proxy.hook_servers() == 2, f"the proxy did not load both hook files:\n{proxy.log_tail()}"
        run = await stack.enter_async_context(NodeRun(kubelet_binary, base / "kubelet", node_containerd, proxy.socket))
        yield ProxiedNode(variant, run, proxy, recorder, batch, hook_dir)


@pytest_asyncio.fixture(loop_scope="session")
async def node(proxied_node: ProxiedNode) -> ProxiedNode:
    """The proxied node once its pods run (at once after the first test), so that each test
    also runs alone."""
    await proxied_node.run.wait_running()
    return proxied_node
