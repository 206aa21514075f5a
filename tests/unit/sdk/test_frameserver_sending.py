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


def _frames(data: bytes) -> list[tuple[int, int, int]]:
    """What was written, frame by frame: (type, stream, DATA payload length)."""
    got, pos = [], 0
    while pos < len(data):
        frame, pos = fr.parse(data, pos, 1 << 24)
        assert frame is not None
        got.append((frame.type, frame.stream_id, len(frame.payload) if frame.type == fr.T_DATA else 0))
    return got


def _data(data: bytes) -> int:
    return sum(n for kind, _, n in _frames(data) if kind == fr.T_DATA)


def _sender() -> tuple[Sender, _Written, list[int]]:
    finished: list[int] = []
    sender = Sender(PeerSettings(), hpack.Encoder(), lambda sid: True, lambda call: finished.append(call.sid))
    written = _Written()
    sender.transport = written  # type: ignore[assignment]
    return sender, written, finished


def test_small_answers_send_no_more_than_the_connection_window_then_the_rest_once_it_grows() -> None:
    """70 answers of 1000 bytes, each within its stream's window and one frame,
    against the peer's connection window of 65535: what does not fit waits,
    in answer order, for the peer's WINDOW_UPDATE. Guards existing behaviour:
    answer's shortcut taking from the connection window and staying within it
    (no test failed without either: 70000 bytes went out)."""
    sender, written, finished = _sender()
    calls = [Call(sid, None, None, fr.DEFAULT_WINDOW) for sid in range(1, 141, 2)]
    for call in calls:
        sender.answer(call, b"m" * 1000)
    sender.pump()
    assert _data(written.data) == fr.DEFAULT_WINDOW and sender.window == 0
    assert finished == [call.sid for call in calls[:65]]  # the 66th has 535 bytes out, the rest wait
    sender.window += 10_000  # as connection.py does for the peer's WINDOW_UPDATE, then pumps
    sender.pump()
    assert _data(written.data) == 70_000 and sender.window == 10_000 - (70_000 - fr.DEFAULT_WINDOW)
    assert finished == [call.sid for call in calls]
    data_order = [sid for kind, sid, _ in _frames(written.data) if kind == fr.T_DATA]
    assert data_order == sorted(data_order)  # each answer's DATA after the one before it


def test_an_answer_while_the_transport_is_paused_writes_no_data_until_it_resumes() -> None:
    """Guards existing behaviour: answer's shortcut is not taken while paused."""
    sender, written, finished = _sender()
    sender.pause()
    sender.answer(Call(1, None, None, fr.DEFAULT_WINDOW), b"m" * 10)
    sender.pump()
    assert _data(written.data) == 0 and finished == []
    sender.resume()
    assert _data(written.data) == 10 and finished == [1]


def test_an_answer_behind_a_queued_one_goes_after_it() -> None:
    """Stream 1's answer waits for the connection window; stream 3's, given
    before the window grows and fitting it, must not take the window first.
    Guards existing behaviour: answer's shortcut is not taken behind a queue."""
    sender, written, finished = _sender()
    sender.window = 5
    sender.answer(Call(1, None, None, fr.DEFAULT_WINDOW), b"a" * 10)
    sender.pump()
    assert _frames(written.data) == [(fr.T_DATA, 1, 5)]
    sender.window += 10
    sender.answer(Call(3, None, None, fr.DEFAULT_WINDOW), b"b" * 10)
    sender.pump()
    assert [f for f in _frames(written.data) if f[0] == fr.T_DATA] == [(fr.T_DATA, 1, 5), (fr.T_DATA, 1, 5),
                                                                      (fr.T_DATA, 3, 5)]
    assert finished == [1]


def test_an_answer_over_the_peers_frame_size_goes_in_frames_of_that_size() -> None:
    """Guards existing behaviour: answer's shortcut takes one frame's answer only."""
    sender, written, finished = _sender()
    sender.answer(Call(1, None, None, fr.DEFAULT_WINDOW), b"m" * (fr.DEFAULT_MAX_FRAME + 1))
    sender.pump()
    assert [f for f in _frames(written.data) if f[0] == fr.T_DATA] == [(fr.T_DATA, 1, fr.DEFAULT_MAX_FRAME),
                                                                      (fr.T_DATA, 1, 1)]
    assert finished == [1]
