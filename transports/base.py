"""The transport contract: what a byte mover offers the layer above and needs from it.

A transport moves *frames* between this rank and its peers. A frame is a small header
(opaque bytes, msgpack-encoded by the layer above; at most
:data:`transports.frames.MAX_HEADER` bytes) and a contiguous payload of ``nbytes`` bytes.
On the wire every frame starts with the 12-byte prefix :data:`transports.frames.PREFIX` =
(header length: u32, payload length: u64), little-endian; :mod:`transports.frames` is the
one codec every transport parses them with.

Receiving is two-phase. When a frame's header has arrived the transport calls
``sink.on_header(peer, header, nbytes)``, and the sink answers with the writable buffer the
payload must land in (a posted receive, or an unexpected-message buffer); the transport
fills it, possibly over several progress calls, then calls ``sink.on_payload(peer)``.
Frames from one peer are delivered strictly in order, one at a time.

Sending is queued: ``send(peer, header, payload, token)`` returns True when the payload has
already left the caller's buffer; otherwise the transport keeps a reference to it and calls
``sink.on_sent(token)`` once it has (the buffer must stay untouched until then).

Nothing happens in the background: ``progress()`` moves what can be moved without
waiting, and ``block(timeout)`` sleeps in the kernel until something may have changed.
"""

from __future__ import annotations

import os
import socket
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol

__all__ = ["Store", "Sink", "Transport", "TransportError", "PeerLostError", "HandshakeError",
           "RemoteAccessError", "ExposureFlags", "host_identity"]


class TransportError(Exception):
    """A transport failed; the layer above turns it into a ``pycomm.CommError``."""


class PeerLostError(TransportError):
    """The peer (``peer``, a world rank) died or its connection dropped."""

    def __init__(self, peer: int, detail: str):
        super().__init__(f"lost connection to rank {peer}: {detail}")
        self.peer = peer


class RemoteAccessError(TransportError):
    """A one-sided read found the peer's buffer no longer exposed (withdrawn or freed).

    The peer is alive and the connection intact; only that message is lost.
    """


class ExposureFlags:
    """Validity words of exposed buffers: the sender's half of a sequence lock.

    A one-sided read cannot be stopped once the reader has the address, yet a withdrawn
    send buffer goes back to the caller, who may overwrite it at once. So each exposure
    gets an 8-byte word in this process holding a unique token while the buffer is
    exposed, and 0 once it is not; :meth:`retire` clears it *before* the buffer is handed
    back. A reader copies ``[word, buffer, word]`` in this order (one scatter-gather
    read, or three ordered reads) and keeps the bytes only if both copies of the word
    hold the token: the second copy was taken after the buffer's, so the buffer was
    still exposed while it was read (the seqlock of the Linux kernel, with a reader
    that retries never: a withdrawn message is simply gone).

    Words live in blocks of ``block`` int64 slots that are never freed while the
    transport lives (a reader may still look at a retired slot).
    """

    def __init__(self, block: int = 1024, on_block=None):
        import numpy as np
        self._np = np
        self._block = block
        self._blocks: list = []
        self._free: list[tuple[int, int]] = []
        self._token = int.from_bytes(os.urandom(6), "little") << 16
        self._on_block = on_block         # called with each new block (e.g. to register it)

    def acquire(self) -> tuple[int, int]:
        """A fresh ``(word address, token)``; the word holds the token until retired."""
        if not self._free:
            arr = self._np.zeros(self._block, dtype=self._np.int64)
            self._blocks.append(arr)
            b = len(self._blocks) - 1
            self._free.extend((b, i) for i in range(self._block - 1, -1, -1))
            if self._on_block is not None:
                self._on_block(arr)
        b, i = self._free.pop()
        self._token = (self._token + 1) & 0x7FFFFFFFFFFFFFFF
        arr = self._blocks[b]
        arr[i] = self._token
        return arr.ctypes.data + 8 * i, self._token

    def retire(self, address: int) -> None:
        """Clear the word at ``address`` (from :meth:`acquire`) and recycle its slot."""
        for b, arr in enumerate(self._blocks):
            base = arr.ctypes.data
            if base <= address < base + 8 * self._block:
                i = (address - base) // 8
                arr[i] = 0
                self._free.append((b, i))
                return


class HandshakeError(TransportError):
    """A connection failed authentication or spoke the wrong protocol."""


class Store(Protocol):
    """The rendezvous key-value store a transport exchanges addresses through."""

    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str, timeout: float | None = None) -> bytes: ...


class Sink(Protocol):
    """The layer above, as a transport sees it (pycomm's p2p engine implements it)."""

    def on_header(self, peer: int, header: bytes, nbytes: int) -> memoryview | None:
        """A frame's header arrived; return a writable byte view of exactly ``nbytes``."""

    def on_payload(self, peer: int) -> None:
        """The payload of the frame announced by the last ``on_header`` has landed."""

    def on_sent(self, token: Any) -> None:
        """A queued send's payload has left the caller's buffer."""

    # Optional: ``on_frame(peer, header, payload)``, a whole frame at once (``payload`` a
    # byte view valid only during the call), which saves a small message the hand-over
    # between on_header and on_payload; see :func:`transports.frames.whole_frame_handler`.


def host_identity() -> str:
    """Return a string equal for two processes exactly when they share a kernel and /dev/shm.

    Hostname plus the kernel boot id (two containers on one host differ in hostname or in
    their /dev/shm mount, which is what the shm transport needs to share).
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = "?"
    try:
        shm = os.stat("/dev/shm")
        shm_id = f"{shm.st_dev}:{shm.st_ino}"
    except OSError:
        shm_id = "none"
    return f"{socket.gethostname()}/{boot}/{shm_id}"


class Transport(ABC):
    """One way of moving frames between this rank and a set of peers.

    Args:
        rank: this process's world rank.
        size: the world size.
        job_id: the job's identifier (names shared resources so a launcher can sweep them).
        token: the job's secret; connections authenticate with it.
        sink: the layer above.
        options: transport-specific settings (documented by each transport).
    """

    name: ClassVar[str]
    #: True when ``read_remote`` can copy a peer's memory in one step (single-copy path).
    one_sided_read: bool = False
    #: True when a thread of this process does the transport's work (an emulated NIC):
    #: a waiting caller must then yield the GIL while it spins, or it starves that thread.
    background_thread: bool = False

    def __init__(self, rank: int, size: int, job_id: str, token: bytes, sink: Sink,
                 **options: Any):
        self.rank = rank
        self.size = size
        self.job_id = job_id
        self.token = token
        self.sink = sink
        self.peers: list[int] = []

    @staticmethod
    def local_info() -> dict:
        """Facts about this process that ``can_connect`` compares (msgpack-serialisable)."""
        return {"host": host_identity(), "pid": os.getpid()}

    @staticmethod
    @abstractmethod
    def can_connect(mine: dict, theirs: dict) -> bool:
        """Whether this transport can link two ranks with the given ``local_info``."""

    @abstractmethod
    def connect(self, store: Store, peers: list[int], timeout: float) -> None:
        """Connect to every rank in ``peers`` (all of which call connect too).

        Raises:
            TransportError: a peer could not be reached or failed the handshake in time.
        """

    @abstractmethod
    def send(self, peer: int, header: bytes, payload: memoryview | None, token: Any) -> bool:
        """Queue one frame to ``peer``; True when the payload buffer is already free."""

    def send_now(self, peer: int, header: bytes, payload: memoryview) -> bool:
        """Hand one whole frame to the medium at once, if it can take it without queueing;
        False (nothing sent) otherwise. A blocking send of a small message then needs no
        request. Default: never."""
        return False

    def recv_now(self, peer: int, header: bytes, dest: memoryview, spin_s: float = 0.0
                 ) -> int:
        """Take ``peer``'s next frame into ``dest`` at once if its header is exactly
        ``header`` and its payload fits; its length, or -1 when nothing has arrived yet and
        -2 when another frame is next (nothing taken: frames stay for :meth:`progress`).
        ``spin_s``: poll for up to that many seconds while nothing has arrived from
        ``peer`` and no other peer has written. Default: never (-2)."""
        return -2

    @abstractmethod
    def progress(self) -> bool:
        """Move whatever can move without waiting; True when anything happened.

        Raises:
            PeerLostError: a peer died or hung up.
        """

    @abstractmethod
    def block(self, timeout: float) -> None:
        """Sleep until something may have changed on a link, or ``timeout`` seconds pass.

        Only waits: it never calls the sink (the next ``progress()`` does the work), so a
        multi-threaded caller can wait without holding its lock.
        """

    def wakeup(self) -> None:
        """Wake a thread of this process sleeping in :meth:`block` (callable from any thread).

        Used when a request completes outside ``progress()`` (a nonblocking collective
        finishing on the progress thread). Default: nothing; the sleeper's slice ends it.
        """

    def check_peers(self) -> None:
        """Raise PeerLostError if a peer is known to be dead (called while waiting long)."""

    # seconds into a stalled wait from which :meth:`not_running` is worth asking; None:
    # this transport cannot tell (the default)
    watch_after: float | None = None

    def not_running(self, peers, awake_since: float) -> tuple[int, str] | None:
        """A peer of ``peers`` known, from outside its process, not to have run (stopped)
        for long while this rank was awake (since ``awake_since``, ``time.monotonic()``),
        as ``(peer, why)``; else None. Must not block. Default: none known."""
        return None

    def closed_peers(self) -> set[int]:
        """Peers that closed cleanly (said goodbye): alive or not, they send nothing more
        (called while waiting long). Default: none known."""
        return set()

    def has_input(self, besides: int | None = None) -> bool:
        """Whether a peer (other than ``besides``) may have sent frames not taken in yet.
        Default: maybe (True), so that a caller runs ``progress()`` to find out."""
        return True

    def has_backlog(self) -> bool:
        """True while frames accepted by :meth:`send` still wait in this process for the
        medium (a full ring, socket or credit window); ``progress()`` moves them on."""
        return False

    # -- one-sided capability (used by the rendezvous protocol when one_sided_read) -------
    def expose(self, view: memoryview) -> Any:
        """Make ``view`` (a send buffer) readable by peers; return a msgpack-able descriptor.

        The descriptor travels in the rendezvous request; the buffer stays untouched until
        :meth:`release` is called with it. Return None to decline (the payload is then
        streamed).
        """
        return None

    def release(self, desc: Any, revoke: bool = False) -> None:
        """The peer is done with the buffer ``desc`` described (default: nothing to do).

        ``revoke``: the send was withdrawn and the buffer goes back to its owner now; a
        read of it still in flight must fail with :class:`RemoteAccessError` rather than
        return bytes the owner writes afterwards.
        """

    def can_read(self, peer: int) -> bool:
        """Whether :meth:`read_remote` works towards ``peer``."""
        return False

    def read_remote(self, peer: int, desc: Any, nbytes: int, dest: memoryview) -> None:
        """Copy ``nbytes`` of the buffer ``peer`` exposed as ``desc`` into ``dest``.

        Raises:
            RemoteAccessError: the buffer was withdrawn before or while it was read.
            PeerLostError: the peer is gone.
        """
        raise NotImplementedError(f"transport {self.name} has no one-sided read")

    @abstractmethod
    def close(self) -> None:
        """Release every resource (sockets, mappings, segments). Idempotent."""
