"""The frame codec every transport shares: sans-I/O, bytes in and sink calls out.

A frame is a 12-byte prefix :data:`PREFIX` (header length u32, payload length u64,
little-endian), an opaque header of at most :data:`MAX_HEADER` bytes (msgpack, written by
the layer above) and the payload. A frame with an empty header and no payload says
goodbye: the peer is closing cleanly.

:class:`FrameDecoder` turns one peer's byte stream, in whatever pieces the medium hands
over (a ring's contiguous span and then its wrapped part, a socket's reads, an RDMA
receive's chunks), into calls of the :class:`~transports.base.Sink`: ``on_frame`` for a
frame that lies whole in one piece (a small message: one call, the payload copied once,
straight from the medium), else ``on_header``, the payload into the view it returned, and
``on_payload``. It checks each prefix once, keeps a prefix or header split between pieces,
and never reads or writes the medium itself, so each transport keeps only its own I/O:
where the bytes are, and when they may be reused (after :meth:`FrameDecoder.feed`
returns, every byte it was given has been consumed or copied).
"""

from __future__ import annotations

import struct

from .base import TransportError

__all__ = ["PREFIX", "MAX_HEADER", "FrameDecoder", "frame_prefix", "whole_frame_handler"]

PREFIX = struct.Struct("<IQ")
MAX_HEADER = 1 << 16


def whole_frame_handler(sink):
    """The sink's ``on_frame``, or one made of its ``on_header`` and ``on_payload``."""
    on_frame = getattr(sink, "on_frame", None)
    if on_frame is not None:
        return on_frame

    def on_frame(peer: int, header: bytes, payload: memoryview) -> None:
        n = len(payload)
        dest = sink.on_header(peer, header, n)
        if n:
            dest[:n] = payload
        sink.on_payload(peer)
    return on_frame


def frame_prefix(header: bytes, nbytes: int) -> bytes:
    """The prefix and header of a frame whose payload is ``nbytes`` long."""
    return PREFIX.pack(len(header), nbytes) + header


class FrameDecoder:
    """Decode one peer's frames (see the module docstring).

    Args:
        peer: the peer's world rank (passed to the sink, named in errors).
        sink: the layer above (``on_header``, ``on_payload``).
        on_frame: ``on_frame(peer, header, payload)`` for whole frames; default: the
            sink's, or one made of its ``on_header`` and ``on_payload``
            (:func:`whole_frame_handler`).

    Attributes:
        goodbye: the peer has said goodbye (an empty frame).
    """

    __slots__ = ("peer", "sink", "on_frame", "dest", "off", "left", "partial", "goodbye")

    def __init__(self, peer: int, sink, on_frame=None):
        self.peer, self.sink = peer, sink
        self.on_frame = on_frame or whole_frame_handler(sink)
        self.dest = None            # the payload's destination while one is landing
        self.off = self.left = 0    # bytes of it landed, and still to come
        self.partial = bytearray()  # a prefix or header split between pieces
        self.goodbye = False

    def feed(self, view: memoryview) -> None:
        """Consume every byte of ``view`` (a byte view; the caller may reuse it after).

        Raises:
            TransportError: a header longer than MAX_HEADER (a corrupt stream or a
                foreign sender); the stream cannot be resynchronised.
        """
        pos, end = 0, len(view)
        on_frame, peer = self.on_frame, self.peer
        while pos < end:
            if self.left:                               # inside a payload
                n = min(end - pos, self.left)
                off = self.off
                self.dest[off:off + n] = view[pos:pos + n]
                pos += n
                self.off, self.left = off + n, self.left - n
                if not self.left:
                    self.dest = None
                    self.sink.on_payload(peer)
                continue
            if self.partial:
                pos = self._complete_partial(view, pos, end)
                continue
            if end - pos < 12:
                self.partial += view[pos:end]
                return
            hlen, plen = PREFIX.unpack_from(view, pos)
            if hlen > MAX_HEADER:
                self._bad_header(hlen)
            stop = pos + 12 + hlen
            if stop + plen <= end:                      # the whole frame is here
                if hlen == 0 and plen == 0:
                    self.goodbye = True
                else:
                    on_frame(peer, bytes(view[pos + 12:stop]), view[stop:stop + plen])
                pos = stop + plen
            elif stop <= end:                           # the header, part of the payload
                self._start(bytes(view[pos + 12:stop]), plen)
                pos = stop
            else:                                       # part of the header
                self.partial += view[pos:end]
                return

    def _complete_partial(self, view: memoryview, pos: int, end: int) -> int:
        """Add to a split prefix/header; dispatch it once whole. Returns the new pos."""
        part = self.partial
        if len(part) < 12:
            take = min(12 - len(part), end - pos)
            part += view[pos:pos + take]
            pos += take
            if len(part) < 12:
                return pos
            if PREFIX.unpack_from(part, 0)[0] > MAX_HEADER:
                self._bad_header(PREFIX.unpack_from(part, 0)[0])
        hlen, plen = PREFIX.unpack_from(part, 0)
        take = min(12 + hlen - len(part), end - pos)
        part += view[pos:pos + take]
        pos += take
        if len(part) == 12 + hlen:
            header = bytes(part[12:])
            self.partial = bytearray()
            if hlen == 0 and plen == 0:
                self.goodbye = True
            else:
                self._start(header, plen)
        return pos

    def _start(self, header: bytes, plen: int) -> None:
        dest = self.sink.on_header(self.peer, header, plen)
        if plen == 0:
            self.sink.on_payload(self.peer)
        else:
            self.dest, self.off, self.left = dest, 0, plen

    def payload_target(self) -> memoryview | None:
        """Where the rest of the current payload goes (a transport may read straight
        into it, then call :meth:`landed`), or None between payloads."""
        if not self.left:
            return None
        return self.dest[self.off:self.off + self.left]

    def landed(self, n: int) -> None:
        """``n`` bytes were written into :meth:`payload_target`'s view."""
        self.off += n
        self.left -= n
        if not self.left:
            self.dest = None
            self.sink.on_payload(self.peer)

    def _bad_header(self, hlen: int):
        raise TransportError(f"rank {self.peer} sent a {hlen}-byte header (at most "
                             f"{MAX_HEADER}): the stream is corrupt")
