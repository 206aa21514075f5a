"""The hook server of README.md's "Writing a hook server", run as it is
written, behind the proxy."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import types
from pathlib import Path

import pytest

from grpc import aio

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.app import RunningProxy
from runtimeproxy.host.containerd import terminate_process

from ...hookprocs import registered
from ..fakes import FakeBackend
from .conftest import CREATE, REPO, create_request


def readme_example() -> str:
    """The first python block of the section, exactly as written."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Writing a hook server\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"^```python\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert match, "no python block in the section"
    return match.group(1)


def readme_test_of_the_example() -> str:
    """The section's second python block: a test of the first's hook server."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Writing a hook server\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 2, "no test of the example in the section"
    return blocks[1]


async def test_readme_test_of_the_example_passes_against_it(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What README tells a hook's author to test it with works as written:
    it imports the example (as example_hook.py, which serves only when run)."""
    example = types.ModuleType("example_hook")
    exec(compile(readme_example(), "README example", "exec"), example.__dict__)
    monkeypatch.setitem(sys.modules, "example_hook", example)
    namespace: dict[str, object] = {"__name__": "readme_test"}
    exec(compile(readme_test_of_the_example(), "README test", "exec"), namespace)
    test = namespace["test_example_hook"]
    assert [mark.name for mark in getattr(test, "pytestmark", [])] == ["asyncio"]  # strict mode runs it too
    await test(sock_dir)  # type: ignore[operator]
    assert list(sock_dir.iterdir()) == []  # the server stopped, its socket gone


def test_example_is_short() -> None:
    assert len(readme_example().splitlines()) < 31


async def test_readme_hook_server_changes_what_reaches_the_runtime(
    running: RunningProxy, fake: FakeBackend, client: aio.Channel, sock_dir: Path, hook_dir: Path
) -> None:
    script = sock_dir / "example_hook.py"
    script.write_text(readme_example())
    sock = sock_dir / "example.sock"
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(sock), str(hook_dir), cwd=REPO, stderr=asyncio.subprocess.PIPE
    )
    try:
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
        sent = v1.CreateContainerRequest.FromString(fake.calls(CREATE)[0].requests[0])
        assert sent.config.linux.resources.cpu_shares == 512
        assert [(e.key, e.value) for e in sent.config.envs] == [("KEEP", b"1"), ("HOOKED_BY", b"example")]
        # Everything else is as kubelet sent it.
        expected = create_request()
        expected.config.linux.resources.cpu_shares = 512
        expected.config.envs.add(key="HOOKED_BY", value=b"example")
        assert sent == expected

        process.send_signal(signal.SIGTERM)
        assert process.stderr is not None
        err = (await asyncio.wait_for(process.stderr.read(), 20)).decode()
        assert await asyncio.wait_for(process.wait(), 20) == 0, err
        assert list(hook_dir.iterdir()) == [] and not sock.exists()
        await registered(running, 0)
    finally:
        await terminate_process(process, 10, "README hook server")
