"""The frames path on uvloop, its client's transport backed up: large answers
the proxy read in pieces (frames cut across its reads, carried to the next)
wait in uvloop's buffer as several pieces per write (Outbound.flush's
writelines: views of the reads, uncopied) until a client that read nothing
for a while reads them all; each must arrive intact."""

from __future__ import annotations

import asyncio
import struct
import sys
from pathlib import Path

import hpack

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.host.process import terminate_process

from .. import rawh2
from ..fakes import FakeBackend
from ..test_process import wait_for_line

LIST = "/runtime.v1.RuntimeService/ListContainers"
CALLS = 40  # about 6 MiB of answers: more than the sockets between the three can hold
MAX_WINDOW = (1 << 31) - 1


def listing() -> v1.ListContainersResponse:
    """About 150 KiB: several reads of the proxy's per answer, frames cut between them."""
    return v1.ListContainersResponse(containers=[
        v1.Container(id=f"{i:064x}", pod_sandbox_id=f"{i:064x}", image_ref=f"sha256:{i:064x}",
                     labels={"io.kubernetes.pod.name": f"pod-{i}", "app": "x" * 200},
                     metadata=v1.ContainerMetadata(name=f"c-{i}", attempt=i), state=v1.CONTAINER_RUNNING)
        for i in range(300)])


async def test_answers_held_in_uvloops_buffer_reach_a_late_reader_intact(fake: FakeBackend, sock_dir: Path) -> None:
    want = listing()
    fake.script(LIST, response=want.SerializeToString())
    listen = sock_dir / "proxy.sock"
    proxy = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy.cli", "serve", "--listen", str(listen), "--backend", str(fake.socket),
        "--hook-dir", str(sock_dir / "hooks.d"), "--data-path", "frames", "--event-loop", "uvloop",
        "--log-format", "json", stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proxy.stderr is not None
        await wait_for_line(proxy.stderr, "serving v1 (native)")
        # (a StreamReader reads ahead up to twice its limit, the default keeps that small)
        reader, writer = await asyncio.open_unix_connection(str(listen))
        # Windows wide open: the proxy may send every answer at once, as fast as
        # the runtime gives them, and its transport to this client backs up.
        writer.write(rawh2.PREFACE
                     + rawh2.frame(rawh2.SETTINGS, 0, 0, struct.pack(">HI", rawh2.SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW))
                     + rawh2.frame(rawh2.WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65_535)))
        writer.write(b"".join(rawh2.grpc_call(2 * i + 1, LIST) for i in range(CALLS)))
        await writer.drain()
        await fake.wait_calls(LIST, CALLS)
        await asyncio.sleep(1)  # not reading meanwhile: the answers pile up in the proxy
        writer.write(rawh2.frame(rawh2.SETTINGS, rawh2.ACK, 0, b""))
        decoder, bodies, statuses = hpack.Decoder(), {}, {}
        async with asyncio.timeout(30):
            while len(statuses) < CALLS:
                head = await reader.readexactly(9)
                payload = await reader.readexactly(int.from_bytes(head[:3], "big"))
                kind, flags, sid = head[3], head[4], struct.unpack(">I", head[5:])[0] & 0x7FFFFFFF
                assert kind not in (rawh2.RST_STREAM, rawh2.GOAWAY), (kind, payload)
                if kind == rawh2.DATA:
                    bodies[sid] = bodies.get(sid, b"") + payload
                elif kind == rawh2.HEADERS:
                    headers = dict(decoder.decode(payload))
                    if flags & rawh2.END_STREAM:
                        statuses[sid] = headers.get("grpc-status")
        assert set(statuses.values()) == {"0"}
        for sid in statuses:
            body = bodies[sid]
            assert struct.unpack(">BI", body[:5]) == (0, len(body) - 5), sid
            assert v1.ListContainersResponse.FromString(body[5:]) == want, sid
        writer.close()
    finally:
        await terminate_process(proxy, 10, "proxy")
