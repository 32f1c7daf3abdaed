"""The shared-memory transport's segment and its single-producer/single-consumer rings.

Layout. Each rank creates one segment ``/dev/shm/pycomm-<job>-<rank>`` holding a control
block and one inbound ring per peer on its host::

    +-------------------+----------------------+----------------------+----
    | ctrl (64 B)       | ring from peers[0]   | ring from peers[1]   | ...
    | doorbell u32      | head u64 | tail u64  |                      |
    | waiting  u32      | (own cache lines)    |                      |
    | pid      u64      | data[ring_bytes]     |                      |
    | goodbye  u64      |                      |                      |
    | no slots u64      |                      |                      |
    | freed blocks u64  |                      |                      |
    +-------------------+----------------------+----------------------+----

Room. A page of a /dev/shm file is allocated when a process first touches it, reading
included; when the tmpfs is full (a container's /dev/shm is 64 MiB unless ``--shm-size``
says otherwise), that touch kills the toucher with SIGBUS, whichever rank it is. So
every range is reserved (``posix_fallocate``, :meth:`Segment.reserve`) before any process
touches it: the control block and the rings when the owner creates its segment, each
communicator's block of the collective area when its slots are first set up
(:mod:`pycomm.shmcoll`). A reservation that finds no room raises :class:`ShmSpaceError`
naming the bytes asked for, the room left and the remedies, before anything is written.

A sender writes frames (12-byte prefix, header, payload; see :mod:`transports.base`) into
its ring in the receiver's segment and advances ``head``; the receiver copies them out and
advances ``tail``. Each counter has a single writer, so no atomics are needed beyond
aligned 8-byte stores, which x86-64 and AArch64 make single-copy atomic; x86-64's TSO
order makes the data visible before the counter that publishes it.

:class:`Segment` maps one rank's segment; :class:`OutRing` is this rank's writing end of
a ring in a peer's segment, :class:`InRing` its reading end of a ring in its own. The
transport that moves frames through them is :mod:`transports.shm`.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
from collections import deque

from .base import TransportError
from .frames import FrameDecoder, frame_prefix
from .linux import futex_wake

__all__ = ["CTRL_BYTES", "HEAD", "InRing", "MIN_RING_BYTES", "OutRing", "RING_HDR_BYTES",
           "Segment", "ShmSpaceError", "TAIL", "WHOLE", "WHOLE_MAX", "address_of",
           "allocate", "fitted_ring_bytes", "rings_bytes", "segment_name", "shm_free",
           "whole_frame"]

CTRL_BYTES = 64
RING_HDR_BYTES = 128
HEAD, TAIL = 0, 8          # u64 indices into a ring header (bytes 0 and 64)
MIN_RING_BYTES = 64 << 10  # the smallest ring fitted_ring_bytes chooses

def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def rings_bytes(peers: int, ring_bytes: int) -> int:
    """Bytes of a segment's control block and inbound rings for ``peers`` peers."""
    return CTRL_BYTES + max(1, peers) * (RING_HDR_BYTES + ring_bytes)


def fitted_ring_bytes(ranks: int, room: int, ring_bytes: int, block: int) -> int:
    """The ring size for ``ranks`` ranks of one host whose /dev/shm has ``room`` bytes
    free, each segment holding its rings and a ``block`` of collective slots.

    ``ring_bytes`` (the default size) while the segments take at most half the room;
    else the largest halving of it, down to :data:`MIN_RING_BYTES`, that does. The other
    half is for what comes later: each communicator's slots, MPI windows, other jobs. A
    tmpfs that cannot hold even that returns :data:`MIN_RING_BYTES` (then the caller
    finds that the segments do not fit). Smaller rings cost bandwidth only where many
    messages are in flight at once (benchmarks/README.md, "Rings fitted to /dev/shm"). In a
    container's 64 MiB /dev/shm, 1 MiB rings fit 8 ranks but half of it only 6.
    """
    ring = ring_bytes
    while ring > MIN_RING_BYTES and \
            2 * ranks * (rings_bytes(ranks - 1, ring) + block) > room:
        ring = max(MIN_RING_BYTES, ring // 2 // 64 * 64)
    return ring


def shm_free(folder: str = "/dev/shm") -> int:
    """Bytes this process may still allocate in ``folder``, or -1 where it cannot make a
    file there (missing, read-only, not its to write)."""
    try:
        if not os.access(folder, os.W_OK | os.X_OK):
            return -1
        room = os.statvfs(folder)
    except OSError:
        return -1
    return room.f_bavail * room.f_frsize


def segment_name(job_id: str, rank: int) -> str:
    """Name of ``rank``'s segment under /dev/shm (the launcher sweeps ``pycomm-<job>-*``)."""
    return f"pycomm-{job_id}-{rank}"


def address_of(view: memoryview) -> int:
    """Address of the first byte of a contiguous byte view (no copy)."""
    if not view.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    import numpy as np  # read-only views (bytes): only the large-message path gets here
    return np.frombuffer(view, dtype=np.uint8).ctypes.data


# A frame whose payload fills the receiver's buffer is read with one unpack
# (ShmTransport.recv_now). header -> (payload bytes n, frame bytes, the unpack_from of
# (prefix + header, payload), the prefix + header expected), for the last n received
# with that header. Payloads up to WHOLE_MAX bytes: the unpack copies the payload once
# more (into a bytes).
WHOLE_MAX = 4096
WHOLE: dict[bytes, tuple] = {}


def whole_frame(header: bytes, n: int) -> tuple:
    if len(WHOLE) >= 4096:
        WHOLE.clear()
    head = frame_prefix(header, n)
    whole = WHOLE[header] = (n, len(head) + n,
                              struct.Struct(f"<{len(head)}s{n}s").unpack_from, head)
    return whole


def allocate(fd: int, start: int, nbytes: int) -> None:
    """Allocate bytes ``[start, start + nbytes)`` of file ``fd`` now (``posix_fallocate``);
    on a file system that cannot, its pages come at the first touch, as before.

    Raises:
        OSError: ENOSPC (no room), or another failure to allocate.
    """
    try:
        os.posix_fallocate(fd, start, nbytes)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise


class ShmSpaceError(TransportError):
    """/dev/shm has no room for a range of a segment that is about to be used."""


class Segment:
    """A mapped segment: control words and ring views."""

    def __init__(self, path: str, nbytes: int, create: bool = False, reserve: int = 0,
                 what: str = ""):
        """Map the ``nbytes`` of file ``path`` (``create``: a new file, which must not
        exist yet, readable by this user only, its first ``reserve`` bytes, ``what``,
        reserved).

        Raises:
            ShmSpaceError: ``create`` and /dev/shm has no room for ``reserve`` bytes (the
                file is removed again).
        """
        try:
            fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        except OSError as exc:
            if not create:
                raise
            raise TransportError(f"cannot make the shared-memory segment {path}: "
                                 f"{exc.strerror}; the shm transport needs a writable "
                                 f"{os.path.dirname(path)} (--transport tcp does not)") from None
        # The file stays open: reserve() allocates later ranges through it (the file
        # itself is unlinked once every peer has mapped it).
        self.fd, self.path = fd, path
        self._reserved: set[tuple[int, int]] = set()    # ranges reserve() allocated
        try:
            if create:
                os.ftruncate(fd, nbytes)
                if reserve:
                    self.reserve(0, reserve, what)
            self.map = mmap.mmap(fd, nbytes)
        except BaseException:
            os.close(fd)
            if create:
                os.unlink(path)
            raise
        self.view = memoryview(self.map)
        self.ctl32 = self.view[:8].cast("I")       # [doorbell, waiting]
        # [pid, said goodbye, no slots, freed blocks]: the last two are
        # pycomm.shmcoll's and pycomm.slotblocks' bitmaps of collective-area blocks
        self.ctl64 = self.view[8:40].cast("Q")
        self._anchor = ctypes.c_uint32.from_buffer(self.map, 0)
        self.futex = ctypes.c_void_p(ctypes.addressof(self._anchor))

    def ring(self, slot: int, ring_bytes: int) -> tuple[memoryview, memoryview]:
        base = CTRL_BYTES + slot * (RING_HDR_BYTES + ring_bytes)
        ctl = self.view[base:base + RING_HDR_BYTES].cast("Q")
        data = self.view[base + RING_HDR_BYTES:base + RING_HDR_BYTES + ring_bytes]
        return ctl, data

    def ring_doorbell(self) -> None:
        c = self.ctl32
        c[0] = (c[0] + 1) & 0xFFFFFFFF
        if c[1]:
            futex_wake(self.futex)

    def reserve(self, start: int, nbytes: int, what: str) -> None:
        """Allocate bytes ``[start, start + nbytes)`` of the file now, so that no touch of
        them can meet a full /dev/shm later (module docstring); a no-op where they are
        allocated already. ``what``: the range, for the error.

        A range this process has reserved before is not asked for again: a tmpfs file
        never gives pages back, and the system call walks the range even where its pages
        are there (a block reused for a new communicator, :mod:`pycomm.slotblocks`, is
        reserved again by each member).

        Raises:
            ShmSpaceError: no room (ENOSPC), naming ``what``, the bytes and the room left.
        """
        if (start, nbytes) in self._reserved:
            return
        try:
            allocate(self.fd, start, nbytes)
            self._reserved.add((start, nbytes))
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            folder = os.path.dirname(self.path)
            room = os.statvfs(folder)
            raise ShmSpaceError(
                f"{folder} has no room for {what}: {_mib(nbytes)} asked for in "
                f"{os.path.basename(self.path)}, {_mib(room.f_bavail * room.f_frsize)} "
                f"free of {_mib(room.f_blocks * room.f_frsize)}. Make {folder} larger "
                "(docker run --shm-size=1g; mount -o remount,size=2g /dev/shm), give each "
                "ring fewer bytes (PYCOMM_SHM_RING_BYTES, one ring per pair of ranks on a "
                "host) or the collective slots fewer (PYCOMM_SHM_COLL_BYTES, 0: none), or "
                "run over TCP (--transport tcp)") from None

    def close(self) -> None:
        os.close(self.fd)
        for v in (self.ctl32, self.ctl64):
            v.release()
        del self._anchor
        self.view.release()
        try:
            self.map.close()
        except BufferError:     # a ring view is still exported; the OS unmaps at exit
            pass


class OutRing:
    __slots__ = ("peer", "ctl", "data", "size", "seg", "queue", "seen_tail", "head", "tail")

    def __init__(self, peer, ctl, data, seg):
        self.peer, self.ctl, self.data, self.seg = peer, ctl, data, seg
        self.size = len(data)
        self.queue: deque = deque()      # [chunks(list of views), index, offset, token]
        self.seen_tail = 0
        # For send_now, which so reads no counter while the ring has room: the head as
        # this process, its only writer, last wrote it (every write of ctl[HEAD] sets
        # it), and the tail as last read (the reader only moves it on: the free space it
        # gives is never too much).
        self.head = self.tail = 0

    def put(self, src, n: int, head: int) -> int:
        """Copy all ``n`` bytes of ``src`` at ring position ``head`` (caller checked space)."""
        pos = head % self.size
        first = self.size - pos
        if n <= first:
            self.data[pos:pos + n] = src
        else:
            self.data[pos:] = src[:first]
            self.data[:n - first] = src[first:]
        return head + n


class InRing:
    __slots__ = ("peer", "ctl", "data", "size", "decoder", "seen_head", "writer", "broken",
                 "tail")

    def __init__(self, peer, ctl, data, writer, decoder: FrameDecoder):
        self.peer, self.ctl, self.data, self.writer = peer, ctl, data, writer
        self.size = len(data)
        self.decoder = decoder
        self.seen_head = 0
        # the tail as this process, its only writer, last wrote it (every write of
        # ctl[TAIL] sets it): recv_now so reads one counter, the head
        self.tail = 0
        self.broken: str | None = None  # why frames from this peer can no longer be taken
