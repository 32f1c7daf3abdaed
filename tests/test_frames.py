"""The shared frame codec (transports.frames): any split of a stream decodes the same.

A recording sink stands in for the engine; frames of random header and payload sizes are
encoded back to back and fed in random pieces (as a ring's wrap, a socket's reads or RDMA
chunks would cut them). What the sink sees must be exactly the frames, in order, whatever
the cut, and with or without the sink's ``on_frame``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transports import TransportError
from transports.frames import MAX_HEADER, PREFIX, FrameDecoder, frame_prefix


class Recorder:
    """A sink that keeps every frame it is handed, whole."""

    def __init__(self, whole: bool):
        self.frames: list[tuple[bytes, bytes]] = []
        self.pending = None
        self.whole_calls = 0
        if whole:
            self.on_frame = self._on_frame

    def _on_frame(self, peer, header, payload):
        assert peer == 3
        self.whole_calls += 1
        self.frames.append((header, bytes(payload)))

    def on_header(self, peer, header, nbytes):
        assert peer == 3 and self.pending is None
        self.pending = (header, bytearray(nbytes))
        return memoryview(self.pending[1])

    def on_payload(self, peer):
        header, body = self.pending
        self.pending = None
        self.frames.append((header, bytes(body)))


def _stream(frames):
    return b"".join(frame_prefix(h, len(p)) + p for h, p in frames)


frame = st.tuples(st.binary(min_size=1, max_size=40), st.binary(max_size=300))


@settings(max_examples=200, deadline=None)
@given(frames=st.lists(frame, max_size=12), cuts=st.lists(st.integers(0, 4000), max_size=20),
       whole=st.booleans())
def test_any_split_of_the_stream_gives_the_same_frames(frames, cuts, whole):
    data = _stream(frames)
    sink = Recorder(whole)
    dec = FrameDecoder(3, sink)
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for a, b in zip(points, points[1:]):
        dec.feed(memoryview(data)[a:b])
    assert sink.frames == [(h, p) for h, p in frames]
    assert sink.pending is None and not dec.goodbye and dec.payload_target() is None
    if whole and len(points) == 2:          # one piece: every frame in one call
        assert sink.whole_calls == len(frames)


def test_a_payload_read_in_place_then_the_next_frame():
    """A transport may land a payload's rest straight into its destination (a socket's
    recv_into): payload_target/landed, and decoding goes on after it."""
    sink = Recorder(whole=False)
    dec = FrameDecoder(3, sink)
    body = bytes(range(256)) * 40
    data = _stream([(b"h1", body), (b"h2", b"xyz")])
    dec.feed(memoryview(data)[:100])        # the prefix, the header, some payload
    target = dec.payload_target()
    assert len(target) == len(body) - (100 - 12 - 2)
    rest = memoryview(data)[100:12 + 2 + len(body)]
    target[:1000] = rest[:1000]
    dec.landed(1000)
    dec.feed(rest[1000:])
    dec.feed(memoryview(data)[12 + 2 + len(body):])
    assert sink.frames == [(b"h1", body), (b"h2", b"xyz")]


def test_an_empty_frame_says_goodbye_in_any_piece():
    for cut in range(0, 13):
        sink = Recorder(whole=True)
        dec = FrameDecoder(3, sink)
        data = _stream([(b"a", b"1")]) + frame_prefix(b"", 0)
        dec.feed(memoryview(data)[:len(data) - 12 + cut])
        dec.feed(memoryview(data)[len(data) - 12 + cut:])
        assert dec.goodbye and sink.frames == [(b"a", b"1")]


@pytest.mark.parametrize("cut", [0, 5, 12])
def test_a_header_longer_than_the_limit_is_an_error_naming_the_peer(cut):
    dec = FrameDecoder(3, Recorder(whole=True))
    data = PREFIX.pack(MAX_HEADER + 1, 0) + b"x" * 20
    with pytest.raises(TransportError, match=r"rank 3 sent a 65537-byte header"):
        dec.feed(memoryview(data)[:cut])
        dec.feed(memoryview(data)[cut:])
