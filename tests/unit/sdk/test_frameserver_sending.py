"""hooks/frameserver/sending.py: an answer's header block is framed as header_frames frames it."""

from __future__ import annotations

import hpack
import pytest

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
