"""hooks/frameserver/sending.py: an answer's header block is framed as header_frames frames it."""

from __future__ import annotations

import hpack
import pytest

from hooks.frameserver.calls import Call
from hooks.frameserver.sending import Sender
from hooks.frameserver.settings import PeerSettings
from runtimeproxy.frames import frame as fr


@pytest.mark.parametrize("max_frame", [fr.DEFAULT_MAX_FRAME, 40_000])
@pytest.mark.parametrize("end_stream", [False, True])
def test_a_block_is_framed_as_header_frames_frames_it(max_frame: int, end_stream: bool) -> None:
    peer = PeerSettings(max_frame=max_frame)
    for size in (0, 1, 60, max_frame - 1, max_frame, max_frame + 1, 2 * max_frame + 5):
        sender = Sender(peer, hpack.Encoder(), lambda sid: True, lambda call: None)
        block = bytes(range(256)) * (size // 256) + bytes(size % 256)
        sender.headers(7, [(b"x", b"y")], block, end_stream)
        assert sender.out == fr.header_frames(7, block, max_frame, end_stream), size


class _Written:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


def _sent(window: int, earlier: bool) -> tuple[bytes, list[int]]:
    """What an answer of 10 bytes on stream 3 writes, once the peer's windows allow, and the calls finished."""
    finished: list[int] = []
    sender = Sender(PeerSettings(), hpack.Encoder(), lambda sid: True, lambda call: finished.append(call.sid))
    written = _Written()
    sender.transport = written  # type: ignore[assignment]
    if earlier:  # an answer on stream 1 waits for its window: the next one queues behind it
        sender.answer(Call(1, None, None, 0), b"w" * 10)
    sender.answer(Call(3, None, None, window), b"a" * 10)
    sender.pump()
    return written.data, finished


@pytest.mark.parametrize("window", [10, 4])
def test_an_answer_sent_at_once_is_framed_as_one_sent_behind_another(window: int) -> None:
    """Guards existing behaviour through answer's shortcut for an answer that fits
    now: the same DATA frames and trailers as through _answer_data's queue."""
    at_once, finished = _sent(window, earlier=False)
    queued, finished_queued = _sent(window, earlier=True)
    assert at_once == queued
    assert finished == finished_queued == ([3] if window == 10 else [])
    data = fr.serialize(fr.T_DATA, 0, 3, b"a" * window)
    if window == 10:  # and the trailers, ending the stream
        assert at_once.startswith(data) and len(at_once) > len(data)
    else:
        assert at_once == data
