"""Point-to-point engine: tag matching, requests, progress, eager and rendezvous protocols.

The engine sits between the communicator and the transports. It speaks in world ranks and
context ids (one per communicator and traffic class) and implements
:class:`transports.base.Sink`.

What the engine is made of. This module holds :class:`Engine` itself: what the
communicator posts (``isend``, ``irecv``, ``iprobe``, ``cancel``; ``send_now`` and
``recv_now``, a small point-to-point message with no request, and ``take_now``, the one
posted receive's message taken so; ``flush``) and the actions below. Its
halves, each on its own page: :class:`pycomm.matching.Matching` (messages arrive: MPI's
matching rules, the unexpected queue, the transports' callbacks),
:class:`pycomm.aborts.CallAborts` (abandoned collective calls) and
:class:`pycomm.waiting.Waiting` (progress and waiting: spin, then sleep in the kernel;
liveness checks; the lock a second thread needs). The rendezvous protocol, whose state is
its own (the large messages in flight), is a component the engine holds: ``rndv``
(:class:`pycomm.rendezvous.Rendezvous`). The frames and their headers:
:mod:`pycomm.wire`.

Frames: EAGER (a whole message), the rendezvous protocol's RTS, CTS, DATA, FIN, CANCEL and
NAK, and ABORT. Collective messages carry the signature of the sender's call
(:mod:`pycomm.signature`); a receive whose own signature differs from the message's fails
with :class:`~pycomm.errors.CollectiveMismatchError` and the payload is discarded, so a
mismatched call never writes another call's bytes into a buffer.

Eager: the sender's buffer is free as soon as the transport has copied it out. The
receiver lands the payload in the posted buffer if a receive matches, otherwise in an
unexpected-message buffer (one extra copy when the receive is posted later).

Rendezvous (messages above ``PYCOMM_EAGER_LIMIT`` bytes, and synchronous sends): the
sender announces the message and keeps its buffer; once a receive matches, the receiver
reads it one-sidedly or the sender streams it into the posted buffer (MPICH's LMT, Open
MPI's ob1). A large send not yet handed over can be withdrawn (:meth:`Engine.cancel`; a
blocking ``Send`` that times out does it).

Abandoned collective calls (:meth:`Engine.abort_call`): a rank that fails inside a
collective call tells every other rank of the communicator with ABORT; each fails the
call's requests, drops its later messages, and counts the call, so the next one matches.

Actions: the engine's sink callbacks (:meth:`Engine.on_header`, ``on_frame``,
``on_payload``) only decide. A frame they answer with (CTS, DATA after a CTS, FIN, NAK,
ABORT) or a one-sided read they start goes to :attr:`Engine.outbox` while a transport is
delivering, and :meth:`Engine.act` carries them out, in order, once it has returned: no
transport is re-entered from inside its own receive loop, and a read of a peer's memory
never runs inside one. Outside a delivery (a receive posted for a message that already
arrived) the same steps run at once.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from transports import TransportError

from .aborts import CallAborts
from .errors import CollectiveError, PeerError
from .matching import ANY_SOURCE, ANY_TAG, Matching, _matches, _Unexpected
from .rendezvous import Rendezvous
from .signature import empty_match
from .request import Request
from .threadlevel import SerializedThreads
from .waiting import SHARED_WAIT, Waiting, default_spin_seconds, default_yield_seconds
from .wire import _EAGER_HEADERS, EAGER, RTS, _eager_header, _pack

__all__ = ["Engine", "Request", "ANY_SOURCE", "ANY_TAG", "PROC_NULL", "null_request",
           "default_spin_seconds", "default_yield_seconds"]

PROC_NULL = -1

_SEND = "send"          # kind of an Engine.outbox action (else a read: pycomm.rendezvous)


def null_request(engine: "Engine") -> Request:
    """A request already complete, as one for a send to or a receive from PROC_NULL is
    (MPI: such an operation succeeds at once, its status's source is PROC_NULL)."""
    req = Request(engine, None, -1, PROC_NULL, ANY_TAG)
    req.source = PROC_NULL
    req._complete()
    return req


class Engine(Matching, CallAborts, Waiting, SerializedThreads):
    """Matching and protocol engine for one process (one per world).

    Args:
        rank: this process's world rank.
        size: world size.
        eager_limit: largest payload in bytes sent eagerly.
        spin_s: seconds to spin before sleeping in the kernel.
        timeout: default seconds any wait may take.
        yield_s: seconds to poll with ``sched_yield`` after spinning, before sleeping (see
            :mod:`pycomm.waiting`).
    """

    def __init__(self, rank: int, size: int, *, eager_limit: int, spin_s: float,
                 timeout: float, yield_s: float = 0.0):
        self.rank, self.size = rank, size
        self.eager_limit = eager_limit
        self.spin_s = spin_s
        self.yield_s = yield_s
        self.timeout = timeout
        self.job_id: str | None = None      # set by the bootstrap: names what the job leaves
        # Payload bytes and messages this rank has handed over for other ranks: every
        # message sent (point-to-point, and the message algorithms' inside collectives),
        # counted where it leaves the engine, whatever the protocol (isend, and the
        # request-free sends of pycomm.pt2pt and pycomm.calls.CallView.sendrecv); calls
        # through shared-memory slots or direct reads send none. A program's own
        # traffic counter (examples/_training.py's WireCounter) reads them.
        self.sent_bytes = 0
        self.sent_messages = 0
        # the communicators on this engine, alive (pycomm.MPI.bridge closes a bridge
        # world's engine at a Disconnect only when none but its own is left)
        self.comms: weakref.WeakSet = weakref.WeakSet()
        self.route: list[Any] = [None] * size       # world rank -> transport
        # world rank -> its transport where a blocking Send or Recv may write or take a
        # whole frame itself (the transport's ``direct_p2p``: send_now with ``repeats``,
        # recv_now with ``alone``); None for this rank and for other transports
        self.direct: list[Any] = [None] * size
        # while a thread waits (pycomm.waiting, "Threads"), ``direct`` is this empty table
        # and the filled one is kept here
        self._direct_all = self.direct
        self._no_direct: list[Any] = [None] * size
        self._waiter: int | None = None   # threading.get_ident() of the thread that waits
        self._hold_lock = threading.Lock()  # taken by that thread for its wait
        self.transports: list[Any] = []
        self.posted: list[Request] = []
        self.unexpected: list[_Unexpected] = []
        # (ctx, tag) -> [how many unexpected messages are of that collective call, their
        # signature (MIXED if they differ)]: the checks at each call's start and end look it
        # up instead of scanning the list, which a fast Bcast root fills with thousands of
        # messages ahead of this rank
        self.coll_tags: dict[tuple[int, int], list] = {}
        self._incoming: dict[int, Any] = {}
        self.rndv = Rendezvous(self)              # large messages in flight
        self.aborted: dict[tuple[int, int], CollectiveError] = {}   # (ctx, tag) -> error
        self.abort_count = 0                      # calls abandoned so far (see comm)
        self.next_cid = 1                         # context ids: see pycomm.groups
        self.oversubscription = 1.0               # agreed ranks per core (bootstrap)
        self.min_cores = 1
        self._failed: PeerError | None = None
        self._threaded = False
        self._yield_gil = False       # spinning waiters must yield the GIL (a transport thread)
        self.offload_running = 0      # collectives the progress thread is running now
        self.offload_ident = None     # that thread's threading.get_ident()
        # nonblocking collectives posted, and finished: each counter has one writer thread
        self.offload_posted = self.offload_done = 0
        # ctx -> (tag, signature, world ranks) of the communicator's latest collective call,
        # set by CollectiveCalls.begin: what an arriving collective message is checked against
        self.current: dict[int, tuple] = {}
        self.lock = None
        # Sink callbacks never do I/O: while a transport delivers frames (``_polling``),
        # the frames and reads they decide on wait here, and :meth:`act` carries them out
        # once the transport has returned (see the module docstring, "Actions").
        self.outbox: list[tuple] = []
        self._polling = False
        # contexts whose calls are not numbered in order (Create_group's set-up context
        # numbers them by the caller's tag): no message there is a leftover of a past call
        self.unordered: set[int] = set()

    # -- set-up ---------------------------------------------------------------------------
    def attach(self, transport, peers: list[int]) -> None:
        """Route ``peers`` through ``transport`` (already connected)."""
        self.transports.append(transport)
        self._yield_gil = self._yield_gil or transport.background_thread
        direct = transport if getattr(transport, "direct_p2p", False) else None
        for p in peers:
            self.route[p] = transport
            self._direct_all[p] = direct if p != self.rank else None

    def close(self) -> None:
        for t in self.transports:
            try:
                t.close()
            except Exception:       # closing must not mask the error that led here
                pass
        self.transports.clear()

    # -- posting --------------------------------------------------------------------------
    def isend(self, view: memoryview, dest: int, ctx: int, tag: int,
              sig: tuple[int, int] | None = None, sync: bool = False) -> Request:
        """Start sending the bytes of ``view`` to world rank ``dest``; returns a Request.

        ``sig``: the collective call's signature (:mod:`pycomm.signature`), or None for
        point-to-point traffic. ``sync``: MPI's synchronous mode, rendezvous at any size,
        so the request completes only once a receive has matched (CTS or FIN came back);
        a send to this rank itself completes when a receive takes the message.

        Raises:
            ThreadLevelError: another thread of this rank is waiting in pycomm.
            PeerError: the link to ``dest`` has failed.
        """
        if self._waiter is not None:
            self._check_thread()
        req = Request(self, view, ctx, dest, tag)
        req.expect = -2                 # marks a send
        if self.aborted and (ctx, tag) in self.aborted:
            req.error = self.aborted[(ctx, tag)]    # a later step of an abandoned call
            req._complete()
            return req
        if dest == self.rank:
            u = self._deliver_local(view, ctx, tag, sig)
            if sync and u is not None:
                u.sender = req          # complete when a receive takes it
            else:
                req._complete()
            return req
        t = self.route[dest]
        n = len(view)
        self.sent_bytes += n
        self.sent_messages += 1
        try:
            if n <= self.eager_limit and not sync:
                if sig is None:
                    hdr = _EAGER_HEADERS.get((ctx, tag))
                    if hdr is None:
                        hdr = _eager_header(ctx, tag)
                else:
                    hdr = _pack((EAGER, ctx, tag, sig[0], sig[1]))
                if t.send(dest, hdr, view, req):
                    req._complete()
            else:
                self.rndv.announce(t, dest, view, n, req, ctx, tag, sig)
        except TransportError as exc:
            raise self._peer_error(exc) from None
        return req

    def send_now(self, view: memoryview, dest: int, ctx: int, tag: int) -> bool:
        """Send a point-to-point message of at most ``eager_limit`` bytes to world rank
        ``dest`` if its transport takes the whole frame at once (True); False when nothing
        was sent and :meth:`isend` must be used (a full ring, this rank itself, a transport
        without the capability, an abandoned call's tag).

        Raises:
            ThreadLevelError: another thread of this rank is waiting in pycomm.
            PeerError: the link to ``dest`` has failed.
        """
        if self._waiter is not None:
            self._check_thread()
        if dest == self.rank or (self.aborted and (ctx, tag) in self.aborted):
            return False
        hdr = _EAGER_HEADERS.get((ctx, tag))
        if hdr is None:
            hdr = _eager_header(ctx, tag)
        try:
            return self.route[dest].send_now(dest, hdr, view)
        except TransportError as exc:
            raise self._peer_error(exc) from None

    def recv_now(self, view: memoryview, source: int, ctx: int, tag: int,
                 spin: bool = False) -> int:
        """Receive the point-to-point eager message (ctx, tag) from world rank ``source``
        straight from the transport if it is the next frame from there and nothing this
        rank holds could match first (no posted receive, no unexpected message, no frame
        half taken in): its length in bytes; -1 when it has not arrived (``spin``: within
        ``spin_s`` seconds), -2 when it cannot be taken so (post a receive: :meth:`irecv`).

        Raises:
            PeerError: the link to ``source`` failed.
            ThreadLevelError: another thread of this rank is waiting in pycomm.
        """
        if self._waiter is not None:
            self._check_thread()
        if self.posted or self.unexpected or self._incoming or self.outbox or \
                source == self.rank:
            return -2
        hdr = _EAGER_HEADERS.get((ctx, tag))
        if hdr is None:
            hdr = _eager_header(ctx, tag)
        t = self.route[source]
        try:
            # Only while nothing else needs this rank: frames queued to other peers, or
            # arrived from them, need progress(), which this path skips (they would wait
            # for as long as the exchange with ``source`` goes on). So, with ``spin``,
            # the transport polls that one link itself for up to spin_s (it stops when
            # another peer writes): the message is seen sooner.
            if t.has_backlog() or t.has_input(besides=source):
                return -2
            return t.recv_now(source, hdr, view, self.spin_s if spin else 0.0)
        except TransportError as exc:
            raise self._peer_error(exc) from None

    def take_now(self, req: Request) -> bool:
        """Complete the one posted receive ``req`` (of a named peer and tag, the eager
        header's) by taking its message straight from the peer's transport, as
        :meth:`recv_now` does, spinning ``spin_s`` for it; True when taken. ``req`` is out
        of the posted list while the transport looks, and back in it, alone as before,
        when nothing was taken (:meth:`pycomm.waiting.Waiting.wait`'s first step).

        Raises:
            PeerError: the link to the peer failed (``req`` stays posted).
        """
        t = self._direct_all[req.peer]     # (``direct`` is empty while a thread waits)
        if t is None:
            return False
        hdr = _EAGER_HEADERS.get((req.ctx, req.tag))
        if hdr is None:
            hdr = _eager_header(req.ctx, req.tag)
        self.posted.pop()
        try:
            n = t.recv_now(req.peer, hdr, req.view, self.spin_s, True)
        except TransportError as exc:
            self.posted.append(req)
            raise self._peer_error(exc) from None
        if n < 0:
            self.posted.append(req)
            return False
        req.count = n
        req._complete()
        return True

    def irecv(self, view: memoryview | None, source: int, ctx: int, tag: int,
              sig: tuple[int, int] | None = None) -> Request:
        """Post a receive into ``view`` (None: allocate a bytearray of the message's size).

        ``sig``: the collective call's signature; a message whose signature differs fails
        the receive with :class:`~pycomm.errors.CollectiveMismatchError`.

        Raises:
            ThreadLevelError: another thread of this rank is waiting in pycomm.
            PeerError: the sender of a message already announced has died.
        """
        if self._waiter is not None:
            self._check_thread()
        req = Request(self, view, ctx, source, tag)
        req.sig = sig
        if self.aborted and (ctx, tag) in self.aborted:
            req.error = self.aborted[(ctx, tag)]    # a later step of an abandoned call
            req._complete()
            return req
        unexpected = self.unexpected
        for i, u in enumerate(unexpected):
            if _matches(u.ctx, u.src, u.tag, ctx, source, tag):
                del unexpected[i]
                if u.sig is not None:
                    self._unqueued(u)
                try:
                    if u.sig != sig and not empty_match(sig, u.sig, u.nbytes):
                        # the payload (arrived or not) is discarded
                        self._mismatch(req, u.src, u.tag, u.nbytes, u.sig)
                        if u.kind == RTS:
                            self.rndv.decline(u.src, u.sid)
                        return req
                    self._take_unexpected(req, u)
                except TransportError as exc:   # the sender died: a CommError, as in waits
                    raise self._peer_error(exc) from None
                return req
        self.posted.append(req)
        return req

    def iprobe(self, source: int, ctx: int, tag: int) -> _Unexpected | None:
        """The earliest arrived message that a receive (source, tag) would match, or None.

        Raises:
            ThreadLevelError: another thread of this rank is waiting in pycomm.
            PeerError: a link failed while making progress.
        """
        self.progress()
        for u in self.unexpected:
            if _matches(u.ctx, u.src, u.tag, ctx, source, tag):
                return u
        return None

    def cancel(self, req: Request) -> bool:
        """Cancel a receive that has not matched yet, or withdraw a rendezvous send.

        A send is withdrawn while its payload has not been handed over (no CTS or FIN has
        arrived; frames that have are taken in first): see :mod:`pycomm.rendezvous` for the
        CANCEL/NAK exchange and its one race. Eager sends, completed requests and matched
        receives are left alone.

        Returns:
            True when ``req`` was cancelled (it is then complete, ``cancelled`` set).

        Raises:
            ThreadLevelError: another thread of this rank is waiting in pycomm.
        """
        if self._waiter is not None:
            self._check_thread()
        if req in self.posted:
            self.posted.remove(req)
            req.cancelled = True
            req._complete()
            return True
        if req.done or req.expect != -2:
            return False
        for i, u in enumerate(self.unexpected):     # a synchronous send to itself
            if u.sender is req:
                del self.unexpected[i]
                if u.sig is not None:
                    self._unqueued(u)
                req.cancelled = True
                req._complete()
                return True
        try:
            self.progress()             # take in a CTS or FIN that has arrived already
        except PeerError:
            pass                        # the peer is gone; withdrawing is still right
        if not self.rndv.withdraw(req):
            return False
        req.cancelled = True
        req._complete()
        return True

    def flush(self, timeout: float) -> bool:
        """Drive progress until no transport holds frames back (e.g. a FIN waiting for flow
        control credit), or ``timeout`` seconds pass. Call before going idle outside pycomm
        (a pool worker between tasks): a peer may be waiting for those frames.

        Returns:
            True when nothing is held back any more.

        Raises:
            PeerError: a peer died or a link failed.
        """
        deadline = time.perf_counter() + timeout
        ts = self.transports
        while any(t.has_backlog() for t in ts):
            if self.progress():
                continue
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            if self._threaded:          # the progress thread may be blocked in a transport
                time.sleep(min(left, 0.001))
            else:
                for t in ts:
                    t.block(min(left, 0.001 if len(ts) > 1 else 0.05))
        return True

    # -- actions: what the sink callbacks decided, carried out after the transport returns
    def _emit(self, peer: int, header: bytes, payload=None, req=None, quiet=False) -> None:
        """Send a frame now, or, inside a transport's delivery, once it has returned.
        ``req``: completed when the transport has taken the payload; ``quiet``: a dead
        peer is ignored (an ABORT to a rank that died learns it nothing). A thread refused
        while another waits (an ABORT of the call it abandons) leaves it to the waiter."""
        if self._polling or (self._waiter is not None and self._refused()):
            self.outbox.append((_SEND, peer, header, payload, req, quiet))
        else:
            self._send_frame(peer, header, payload, req, quiet)

    def _send_frame(self, peer, header, payload, req, quiet) -> None:
        try:
            if self.route[peer].send(peer, header, payload, req) and req is not None:
                req._complete()
        except TransportError:
            if not quiet:
                raise

    def act(self) -> None:
        """Carry out the frames and one-sided reads that frames delivered during the last
        ``transport.progress()`` called for, in the order they were decided.

        Raises:
            TransportError: a peer died or a link failed (the caller makes it a PeerError).
        """
        box = self.outbox
        while box:
            action = box.pop(0)
            if action[0] is _SEND:
                self._send_frame(*action[1:])
            else:
                self.rndv.read(*action[1:])

    def _describe_timeout(self, req, what, limit) -> str:
        if req is None:
            return f"rank {self.rank}: {what} did not complete within {limit:g} s"
        if req.expect == SHARED_WAIT:
            return (f"rank {self.rank}: waiting for rank {req.peer}'s part of {what} (in "
                    f"shared memory) did not complete within {limit:g} s; is that rank in "
                    "the same call? (PYCOMM_TIMEOUT)")
        kind = "send to" if req.expect == -2 else "receive from"
        peer = "any rank" if req.peer == ANY_SOURCE else f"rank {req.peer}"
        return (f"rank {self.rank}: {kind} {peer} (tag {req.tag}) did not complete within "
                f"{limit:g} s; is the peer posting the matching call? (PYCOMM_TIMEOUT)")
