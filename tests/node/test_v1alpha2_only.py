"""`--serve-versions v1alpha2` in front of this kubelet: it refuses to start, naming why.

kubelet 1.26 has no CRI v1alpha2 client any more (1.26 removed it; the
fallback to v1alpha2 on UNIMPLEMENTED existed in 1.23-1.25 only), so the
proxy's UNIMPLEMENTED answer to v1 is what an operator sees in kubelet's
log. The translated path meets this kubelet in the other direction instead:
v1 served, v1alpha2 to the backend (the `v1-to-v1alpha2` variant).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimeproxy.host.containerd import LocalContainerd

from .conftest import DATA_PATHS
from .kubelet import KubeletError
from .noderun import NodeRun
from .proxyproc import ProxyProcess

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.mark.parametrize("data_path", sorted(DATA_PATHS))
async def test_kubelet_refuses_a_proxy_serving_only_v1alpha2(
        kubelet_binary: Path, node_containerd: LocalContainerd, tmp_path: Path, data_path: str) -> None:
    hook_dir = tmp_path / "hooks.d"
    hook_dir.mkdir(mode=0o755)
    proxy = ProxyProcess(tmp_path, node_containerd.socket, hook_dir,
                         ("--serve-versions", "v1alpha2", "--data-path", data_path))
    await proxy.start()
    run = NodeRun(kubelet_binary, tmp_path / "kubelet", node_containerd, proxy.socket)
    try:
        with pytest.raises(KubeletError, match="kubelet exited"):
            await run.__aenter__()
    finally:
        await proxy.stop()
    log = run.kubelet.log_text()
    assert "CRI v1 runtime API is not implemented" in log
    assert "code = Unimplemented desc = runtime-proxy does not serve CRI v1" in log
