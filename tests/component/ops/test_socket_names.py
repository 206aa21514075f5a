"""A socket path with characters a grpc target decodes or cuts (``#``, ``?``,
``%XX``, a space) is bound and dialled as that path: the backend probed and
called, the proxy's listen answered, ``status`` asked (host/unixsocket.py's
grpc_address and grpc_target quote it)."""

from __future__ import annotations

import contextlib
import urllib.parse
from pathlib import Path

import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.admin import fetch_status
from runtimeproxy.app import build_proxy
from runtimeproxy.config import ProxyConfig

from ..fakes import FakeBackend

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
ODD = "a#b?c%41d e"  # unquoted, grpc would dial a, bind aAd e.


@pytest.mark.parametrize("data_path", ["frames", "grpc"])
async def test_sockets_named_with_characters_a_url_decodes_are_those_paths(sock_dir: Path, data_path: str) -> None:
    hook_dir = sock_dir / "hooks.d"
    hook_dir.mkdir(mode=0o755)
    listen = sock_dir / f"p{ODD}.sock"
    async with FakeBackend(sock_dir / f"cri{ODD}.sock") as fake, contextlib.AsyncExitStack() as stack:
        fake.script(CREATE, response=v1.CreateContainerResponse(container_id="c-1").SerializeToString())
        assert fake.socket.is_socket()
        config = ProxyConfig(listen=listen, backend=fake.socket, hook_dir=hook_dir, data_path=data_path)
        running = await build_proxy(config, stack)
        await running.proxy.wait_ready(10)
        async with aio.insecure_channel("unix://" + urllib.parse.quote(str(listen))) as channel:
            raw = await channel.unary_unary(CREATE)(v1.CreateContainerRequest(pod_sandbox_id="p").SerializeToString(), timeout=10)
        assert v1.CreateContainerResponse.FromString(raw).container_id == "c-1"
        status = await fetch_status(listen)
        assert status["backend"]["connected"] is True and status["listen"] == str(listen)
    assert sorted(p.name for p in sock_dir.iterdir() if p.name != "hooks.d") == []  # nothing bound elsewhere, all removed
