"""The wire: frames split anywhere, containerd's 4096-byte first-frame rule,
a runtime that goes away and comes back, a socket the runtime made for us."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

from cri_api.nri import api_pb2 as nri
from runtimeproxy.nri.app import NriPlugin, NriSettings

from ...hookprocs import hook_server
from .conftest import container, pod
from .fakeruntime import FIRST_FRAME_LIMIT, PluginLink, fake_runtime

E = nri.Event


async def test_messages_split_at_every_frame_boundary(connect) -> None:
    plugin, link = await connect()
    event = nri.StateChangeEvent(event=E.RUN_POD_SANDBOX, pod=pod())
    # One message cut into two mux frames at every position.
    event.pod.id = "pod-0000"
    length = len(_envelope_of(event))
    for cut in range(1, length):
        link.framer = lambda message, cut=cut: [message[:cut], message[cut:]]
        event.pod.id = f"pod-{cut:04d}"  # same length every time
        await link.call("StateChange", event, nri.Empty)
    assert len(plugin.store.pods) == length - 1  # every one arrived and was recorded
    # And the whole byte stream written one byte at a time.
    link.framer = lambda message: [message[:7], message[7:20], message[20:]]
    link.writes = lambda data: [data[i : i + 1] for i in range(len(data))]
    answer = await link.create_container(pod(), container())
    assert answer == nri.CreateContainerResponse(adjust=nri.ContainerAdjustment())


def _envelope_of(event: nri.StateChangeEvent) -> bytes:
    """The ttrpc message the fake sends for this event (stream ids keep their width)."""
    from cri_api.ttrpc import request_pb2 as ttrpc_pb

    body = ttrpc_pb.Request(
        service="nri.pkg.api.v1alpha1.Plugin", method="StateChange", payload=event.SerializeToString(),
        timeout_nano=int(2.0 * 1e9),
    ).SerializeToString()
    return struct.pack(">IIBB", len(body), 1, 1, 0) + body


async def test_large_messages_both_ways_keep_the_first_frame_rule(connect, sock_dir, hook_dir) -> None:
    big = {f"note-{i:03d}": "v" * 64 for i in range(150)}  # about 12 KB of annotations
    async with hook_server(sock_dir, "big", {"PreCreateContainer": {"container_annotations": big}}) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        pods = [pod(f"pod-{i}", uid=f"uid-{i}") for i in range(100)]  # a Synchronize well over 4096 bytes
        plugin, link = await connect(pods)
        answer = await link.create_container(pods[1], container(pod_id="pod-1"))
    assert len(plugin.store.pods) == 100
    assert dict(answer.adjust.annotations) == big
    assert answer.ByteSize() > 2 * FIRST_FRAME_LIMIT
    firsts = [length for conn, length, first in link.frames if first]
    assert max(firsts) == FIRST_FRAME_LIMIT  # the big answer began with a full first frame ...
    assert any(not first for _, _, first in link.frames)  # ... and went on in the next
    assert not link.closed.is_set()


async def test_the_fake_drops_a_plugin_that_breaks_the_rule(runtime) -> None:
    """The rule the plugin keeps is enforced: a longer first frame closes the
    connection, as in containerd."""
    _, writer = await asyncio.open_unix_connection(str(runtime.path))
    link = await runtime.next_link()
    body = b"\0" * (FIRST_FRAME_LIMIT + 1 - 10)
    writer.write(struct.pack(">II", 2, FIRST_FRAME_LIMIT + 1) + struct.pack(">IIBB", len(body), 1, 1, 0) + body)
    await writer.drain()
    await asyncio.wait_for(link.closed.wait(), 5)
    assert link.close_reason == f"first frame of {FIRST_FRAME_LIMIT + 1} bytes on connection 2"
    writer.close()


class _Seen(logging.Handler):
    def __init__(self, message: str, event: asyncio.Event) -> None:
        super().__init__()
        self.message, self.event = message, event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == self.message:
            self.event.set()


async def test_reconnects_and_resynchronizes(sock_dir, start_plugin, caplog) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy.nri.app")
    path = sock_dir / "nri.sock"
    retrying = asyncio.Event()
    handler = _Seen("NRI socket not reachable yet, retrying", retrying)
    logging.getLogger("runtimeproxy.nri.app").addHandler(handler)
    async with fake_runtime(path) as first:
        plugin = await start_plugin()
        link = await first.next_link()
        await link.handshake([pod("old", uid="uid-old")], [container("c-old", "old", "uid-old")])
        assert set(plugin.store.pods) == {"old"}
        link.close()  # the runtime drops the connection ...
        again = await first.next_link()  # ... and the plugin comes back at once
        await again.handshake([pod("kept", uid="uid-kept")])
        assert set(plugin.store.pods) == {"kept"} and not plugin.store.containers
    # The runtime restarts: the socket is gone until the plugin has retried.
    await asyncio.wait_for(retrying.wait(), 10)
    async with fake_runtime(path) as second:
        link = await second.next_link()
        await link.handshake([pod("new", uid="uid-new")])
        assert link.registered.result().plugin_name == "runtime-proxy"
        assert set(plugin.store.pods) == {"new"}
        await asyncio.wait_for(plugin.connected.wait(), 5)
    logging.getLogger("runtimeproxy.nri.app").removeHandler(handler)


async def test_pre_connected_socket_from_the_runtime(hook_dir) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    settings = NriSettings.from_environment(
        NriSettings(hook_dir=hook_dir),
        {"NRI_PLUGIN_SOCKET": str(theirs.detach()), "NRI_PLUGIN_NAME": "rp", "NRI_PLUGIN_IDX": "42"},
    )
    plugin = NriPlugin(settings)
    run = asyncio.create_task(plugin.run(asyncio.Event()))
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    link = PluginLink(reader, writer)
    reading = asyncio.create_task(link.read())
    await link.handshake([pod()])
    assert (link.registered.result().plugin_name, link.registered.result().plugin_idx) == ("rp", "42")
    assert set(plugin.store.pods) == {"pod-1"}
    link.close()  # the runtime that started the plugin goes away: the plugin ends
    await asyncio.wait_for(run, 10)
    await reading


async def test_a_broken_ttrpc_frame_ends_the_connection(runtime, connect) -> None:
    """A frame the plugin cannot read leaves nothing sensible on that stream:
    it closes the connection (and reconnects) rather than serve no more."""
    plugin, link = await connect([pod()])
    too_long = struct.pack(">IIBB", 5 * 1024 * 1024, 99, 1, 0)  # over ttrpc's 4 MiB
    link.writer.write(struct.pack(">II", 1, len(too_long)) + too_long)
    await asyncio.wait_for(link.closed.wait(), 5)
    again = await runtime.next_link()
    await again.handshake([pod()])
    assert set(plugin.store.pods) == {"pod-1"}
