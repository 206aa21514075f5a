"""The proxy's own connection windows: the gate that holds a hooked answer, and
the backend-direction queue (frames/window.py, outbound.py, inbound.py)."""

from __future__ import annotations

import asyncio

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import ErrorCode, Flag, FrameType
from runtimeproxy.frames.inbound import Inbound
from runtimeproxy.frames.outbound import Outbound
from runtimeproxy.frames.window import Gate

from .test_frame import _frames, _Writer


async def test_a_gate_holds_what_follows_it_until_opened() -> None:
    writer = _Writer()
    out = Outbound(writer, lambda n: None, hold_limit=1 << 30)  # type: ignore[arg-type]
    out.preface(b"")  # the server preface is out: nothing is held
    trailers = fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, b"\x88")
    gate = out.gate(trailers, limit=60, stalls=lambda: True)
    out.frames(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 3, b"\x88"))  # another stream's answer
    out.data(3, b"x" * 10, False, raw=fr.serialize(FrameType.DATA, 0, 3, b"x" * 10))
    out.control(fr.window_update(0, 7))  # not held
    out.flush()
    assert [f.type for f in _frames(writer.written)] == [FrameType.WINDOW_UPDATE]
    gate.open()
    assert [(f.type, f.stream_id) for f in _frames(writer.written)[1:]] == [
        (FrameType.HEADERS, 1), (FrameType.HEADERS, 3), (FrameType.DATA, 3),
    ]


async def test_a_gate_opens_by_itself_after_its_limit() -> None:
    writer = _Writer()
    out = Outbound(writer, lambda n: None, hold_limit=1 << 30)  # type: ignore[arg-type]
    out.preface(b"")  # the server preface is out: nothing is held
    gate = out.gate(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, b"\x88"), limit=0.01, stalls=lambda: True)
    opened = asyncio.get_running_loop().create_future()
    real_open = gate._on_open  # noqa: SLF001 - observe the timer's open

    def on_open() -> None:
        real_open()
        opened.set_result(None)

    gate._on_open = on_open  # noqa: SLF001
    await asyncio.wait_for(opened, 5)
    assert gate.is_open and len(_frames(writer.written)) == 1


async def test_gates_open_by_themselves_each_at_its_own_limit_and_once() -> None:
    """Their limits share one timer: one that comes later with an earlier
    limit sets it sooner, one opened before its limit is not opened again,
    and none is left behind once all are open."""
    writer = _Writer()
    out = Outbound(writer, lambda n: None, hold_limit=1 << 30)  # type: ignore[arg-type]
    out.preface(b"")
    loop = asyncio.get_running_loop()
    started = loop.time()
    opened: dict[str, list[float]] = {"late": [], "early": [], "answered": []}
    done = {name: loop.create_future() for name in opened}

    def gate(sid: int, name: str, limit: float) -> Gate:
        made = out.gate(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, b"\x88"), limit=limit,
                        stalls=lambda: True)
        real_open = made._on_open  # noqa: SLF001 - observe each opening

        def on_open() -> None:
            real_open()
            opened[name].append(loop.time() - started)
            if not done[name].done():
                done[name].set_result(None)

        made._on_open = on_open  # noqa: SLF001
        return made

    gate(1, "late", 0.2)
    gate(3, "early", 0.05)
    gate(5, "answered", 0.1).open()  # its call's stages were done first
    await asyncio.wait_for(asyncio.gather(*done.values()), 5)
    assert [len(times) for times in opened.values()] == [1, 1, 1]
    assert opened["early"][0] >= 0.05 - 0.002 and opened["late"][0] >= 0.2 - 0.002  # (libuv counts milliseconds)
    assert opened["early"][0] < opened["late"][0]
    assert [f.stream_id for f in _frames(writer.written)] == [1, 3, 5]  # in the order they came, all out
    assert len(out._gates) == 0 and out._gates_timer is None  # noqa: SLF001


async def test_a_gate_opens_once_the_backends_data_behind_it_reaches_the_hold_limit() -> None:
    """The backend's window comes back only as its DATA leaves: held further, the
    backend could send nothing more, the gated call's own answer included."""
    writer, credits = _Writer(), []
    out = Outbound(writer, credits.append, hold_limit=100)  # type: ignore[arg-type]
    out.preface(b"")  # the server preface is out: nothing is held
    gate = out.gate(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, b"\x88"), limit=60, stalls=lambda: True)
    out.data(3, b"x" * 60, False, credit=60)
    out.frames(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 5, b"\x88"))  # costs the backend no window
    out.data(1, b"y" * 39, False, credit=39)
    out.flush()
    assert not gate.is_open and writer.written == b"" and credits == []
    out.data(1, b"z", False, credit=1)  # 100 owed to the backend, all behind the gate
    out.flush()
    assert gate.is_open
    assert [(f.type, f.stream_id, len(f.payload)) for f in _frames(writer.written)] == [
        (FrameType.HEADERS, 1, 1), (FrameType.DATA, 3, 60), (FrameType.HEADERS, 5, 1), (FrameType.DATA, 1, 39),
        (FrameType.DATA, 1, 1),
    ]
    assert sum(credits) == 100


def test_inbound_queues_data_over_the_backends_window_and_keeps_a_reset_behind_it() -> None:
    writer, credits = _Writer(), []
    inbound = Inbound(writer, credits.append)  # type: ignore[arg-type]
    assert not inbound.take(65_536)  # more than the window: nothing spent
    assert inbound.take(60_000)
    inbound.data(5, b"a" * 10_000, True, credit=10_000)  # 5,535 now, the rest waits
    inbound.ordered(fr.rst_stream(5, ErrorCode.CANCEL))  # behind the queued DATA
    assert not inbound.take(1)  # DATA waits: nothing may overtake it
    sent = _frames(writer.written)
    assert [(f.type, len(f.payload)) for f in sent] == [(FrameType.DATA, 5_535)]
    assert credits == []  # the client's window comes back once all of it has gone
    inbound.grow(100_000)
    rest = _frames(writer.written)[1:]
    assert [(f.type, len(f.payload), f.has(Flag.END_STREAM)) for f in rest] == [
        (FrameType.DATA, 4_465, True), (FrameType.RST_STREAM, 4, False),
    ]
    assert credits == [10_000] and inbound.queued == 0 and inbound.take(1)
