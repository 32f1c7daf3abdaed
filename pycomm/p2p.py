"""Point-to-point engine: tag matching, requests, progress, eager and rendezvous protocols.

The engine sits between the communicator and the transports. It speaks in world ranks and
context ids (one per communicator and traffic class) and implements
:class:`transports.base.Sink`.

Protocols (header = msgpack list; the first item is the frame kind):

======== ====================================== ==========================================
kind      header                                 meaning
======== ====================================== ==========================================
EAGER    [0, ctx, tag(, code, count)] + payload  the whole message (<= eager limit)
RTS      [1, ctx, tag, nbytes, sid, desc(,       request to send a large message
         code, count)]
CTS      [2, sid, rid]                           receiver matched it: stream into rid
DATA     [3, rid]               + payload        the large message, landing in place
FIN      [4, sid]                                receiver copied it one-sidedly: sender done
CANCEL   [5, sid]                                sender withdraws its RTS (a Send that timed
                                                 out, or Request.Cancel on a pending send)
NAK      [6, rid]                                answer to a CTS for a withdrawn message
ABORT    [7, ctx, tag, mismatch, text]           the sender abandoned collective call ``tag``
======== ====================================== ==========================================

Collective messages carry the signature of the sender's call (``code, count``: see
:mod:`pycomm.signature`); point-to-point messages carry none. A receive whose own
signature differs from the message's fails with
:class:`~pycomm.errors.CollectiveMismatchError` and the payload is discarded, so a
mismatched call never writes another call's bytes into a buffer.

Abandoned collective calls (:meth:`Engine.abort_call`): a rank that fails inside a
collective call, or rejects its arguments before sending, tells every other rank of the
communicator with ABORT. Each fails that call's pending requests with
:class:`~pycomm.errors.CollectiveError` (withdrawing its large sends), drops the call's
messages that arrive later, and fails every later send or receive of the call at once,
so a rank that has not entered it yet fails at its first step (:meth:`Engine.aborted_error`
tells the communicator of a call with no step on this rank). Every rank counts the call,
so the next one matches.

Eager: the sender's buffer is free as soon as the transport has copied it out. The
receiver lands the payload in the posted buffer if a receive matches, otherwise in an
unexpected-message buffer (one extra copy when the receive is posted later).

Rendezvous (messages above ``PYCOMM_EAGER_LIMIT`` bytes): the sender announces the message
(RTS, with a descriptor of its buffer, ``transport.expose(view)``, when the transport can
be read one-sidedly: an address for cross-memory attach, (address, rkey) for RDMA) and
keeps the buffer. When a receive matches, the receiver either copies the sender's buffer directly
into its own with the transport's one-sided read and answers FIN (shm + cross-memory
attach: one copy in all), or answers CTS and the sender streams the payload, which the
transport lands directly in the posted buffer (no extra copy: the payload is never staged
as an unexpected message). The same pattern as MPICH's LMT and Open MPI's ob1 PML.

Withdrawing a large send (:meth:`Engine.cancel`; a blocking ``Send`` does it when it times
out, so that its buffer, handed back to the caller, is never read afterwards): the sender
forgets the message and sends CANCEL. A receiver that has not matched the RTS drops it and
answers FIN, so the message is never received. One that matched it already either copied
it (its FIN is then discarded) or is waiting for the payload: the sender answers its CTS
with NAK, and that receive fails with a :class:`~pycomm.errors.CommError` naming the
sender. A receiver reading the buffer one-sidedly at the very moment the sender withdraws
it cannot copy bytes the caller is already overwriting: the transport's read checks the
exposure's validity word before and after the copy (a sequence lock; see
``Transport.expose``), and a read that overlapped the withdrawal fails the receive with
that same error instead.

Matching follows MPI: a receive matches the earliest arrived message with the same
context, a matching source (or ANY_SOURCE) and tag (or ANY_TAG); messages between a pair
never overtake each other, since transports deliver in order.

Actions: the engine's sink callbacks (:meth:`Engine.on_header`, ``on_frame``,
``on_payload``) only decide. A frame they answer with (CTS, DATA after a CTS, FIN, NAK,
ABORT) or a one-sided read they start goes to :attr:`Engine.outbox` while a transport is
delivering, and :meth:`Engine.act` carries them out, in order, once it has returned: no
transport is re-entered from inside its own receive loop, and a read of a peer's memory
never runs inside one. Outside a delivery (a receive posted for a message that already
arrived) the same steps run at once.

Progress and waiting (spin, then sleep in the kernel; liveness checks; the lock a second
thread needs) are :class:`pycomm.waiting.Waiting`, which the engine inherits.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack

from transports import RemoteAccessError, TransportError

from .errors import (CollectiveError, CollectiveMismatchError, CommError, PeerError,
                     TruncationError)
from .signature import describe, empty_match
from .request import Request
from .waiting import SHARED_WAIT, Waiting, default_spin_seconds, default_yield_seconds

__all__ = ["Engine", "Request", "ANY_SOURCE", "ANY_TAG", "PROC_NULL", "null_request",
           "default_spin_seconds", "default_yield_seconds"]

ANY_SOURCE = -2
ANY_TAG = -1
PROC_NULL = -1

EAGER, RTS, CTS, DATA, FIN, CANCEL, NAK, ABORT = 0, 1, 2, 3, 4, 5, 6, 7
_SEND, _READ = "send", "read"           # kinds of Engine.outbox actions
_perf = time.perf_counter
_ABORTED_KEEP = 1024            # abandoned calls remembered (to drop their late messages)
# One Packer for every header: msgpack.packb builds a new Packer per call, which doubles the
# cost of a small message's header. Packer.pack runs without releasing the GIL and resets
# its buffer on error, so the progress thread may share it.
_pack = msgpack.Packer().pack
MIXED = object()        # Engine.coll_tags: messages of one call with different signatures
_unpack = msgpack.unpackb


# Eager headers depend only on (context, tag): pack each once, parse each once.
_EAGER_HEADERS: dict[tuple[int, int], bytes] = {}
_HEADERS: dict[bytes, list] = {}


def _eager_header(ctx: int, tag: int) -> bytes:
    hdr = _pack((EAGER, ctx, tag))
    if len(_EAGER_HEADERS) > 4096:
        _EAGER_HEADERS.clear()
    _EAGER_HEADERS[(ctx, tag)] = hdr
    return hdr


class _Unexpected:
    __slots__ = ("ctx", "src", "tag", "nbytes", "kind", "buf", "arrived", "sid", "desc",
                 "matched", "sig", "sender")

    def __init__(self, ctx, src, tag, nbytes, kind, sig=None):
        self.ctx, self.src, self.tag, self.nbytes, self.kind = ctx, src, tag, nbytes, kind
        self.sig = sig
        self.buf: bytearray | None = None
        self.arrived = False
        self.sid = 0
        self.desc = None
        self.matched: Request | None = None
        self.sender: Request | None = None      # a synchronous send to this rank itself


def null_request(engine: "Engine") -> Request:
    """A request already complete, as one for a send to or a receive from PROC_NULL is
    (MPI: such an operation succeeds at once, its status's source is PROC_NULL)."""
    req = Request(engine, None, -1, PROC_NULL, ANY_TAG)
    req.source = PROC_NULL
    req._complete()
    return req


def _matches(ctx, src, tag, r_ctx, r_src, r_tag) -> bool:
    return r_ctx == ctx and (r_src == src or r_src == ANY_SOURCE) and \
        (r_tag == tag or (r_tag == ANY_TAG and tag >= 0))


class Engine(Waiting):
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
        self.route: list[Any] = [None] * size       # world rank -> transport
        self.transports: list[Any] = []
        self.posted: list[Request] = []
        self.unexpected: list[_Unexpected] = []
        # (ctx, tag) -> [how many unexpected messages are of that collective call, their
        # signature (MIXED if they differ)]: the checks at each call's start and end look it
        # up instead of scanning the list, which a fast Bcast root fills with thousands of
        # messages ahead of this rank
        self.coll_tags: dict[tuple[int, int], list] = {}
        self._incoming: dict[int, Any] = {}
        self._sends: dict[int, Request] = {}
        self._recvs: dict[int, Request] = {}
        self._exposed: dict[int, tuple] = {}     # sid -> (transport, descriptor)
        self._withdrawn: set[int] = set()         # sids of cancelled sends (see cancel)
        self.aborted: dict[tuple[int, int], CollectiveError] = {}   # (ctx, tag) -> error
        self.abort_count = 0                      # calls abandoned so far (see comm)
        self._next_id = 1
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
        for p in peers:
            self.route[p] = transport

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
        """
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
                sid = self._next_id
                self._next_id += 1
                self._sends[sid] = req
                desc = t.expose(view) if t.one_sided_read else None
                if desc is not None:
                    self._exposed[sid] = (t, desc)
                t.send(dest, _pack((RTS, ctx, tag, n, sid, desc) if sig is None else
                                   (RTS, ctx, tag, n, sid, desc, sig[0], sig[1])),
                       None, None)
        except TransportError as exc:
            raise self._peer_error(exc) from None
        return req

    def send_now(self, view: memoryview, dest: int, ctx: int, tag: int) -> bool:
        """Send a point-to-point message of at most ``eager_limit`` bytes to world rank
        ``dest`` if its transport takes the whole frame at once (True); False when nothing
        was sent and :meth:`isend` must be used (a full ring, this rank itself, a transport
        without the capability, an abandoned call's tag)."""
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
        """
        if self.posted or self.unexpected or self._incoming or self.outbox or \
                source == self.rank:
            return -2
        hdr = _EAGER_HEADERS.get((ctx, tag))
        if hdr is None:
            hdr = _eager_header(ctx, tag)
        t = self.route[source]
        poll = t.recv_now
        try:
            # Only while nothing else needs this rank: frames queued to other peers, or
            # arrived from them, need progress(), which this path skips (they would wait
            # for as long as the exchange with ``source`` goes on).
            if t.has_backlog() or t.has_input(besides=source):
                return -2
            n = poll(source, hdr, view)
            if n == -1 and spin:
                # Nothing else runs while this spins (no progress: the checks above hold),
                # so it polls the transport alone: the message is seen sooner; now and
                # then it looks whether another peer has written.
                end = _perf() + self.spin_s
                while n == -1:
                    for _ in range(16):
                        n = poll(source, hdr, view)
                        if n != -1:
                            return n
                    if _perf() >= end or t.has_input(besides=source):
                        break
            return n
        except TransportError as exc:
            raise self._peer_error(exc) from None

    def irecv(self, view: memoryview | None, source: int, ctx: int, tag: int,
              sig: tuple[int, int] | None = None) -> Request:
        """Post a receive into ``view`` (None: allocate a bytearray of the message's size).

        ``sig``: the collective call's signature; a message whose signature differs fails
        the receive with :class:`~pycomm.errors.CollectiveMismatchError`.
        """
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
                            self._send_ctl(u.src, (FIN, u.sid))
                        return req
                    self._take_unexpected(req, u)
                except TransportError as exc:   # the sender died: a CommError, as in waits
                    raise self._peer_error(exc) from None
                return req
        self.posted.append(req)
        return req

    def iprobe(self, source: int, ctx: int, tag: int) -> _Unexpected | None:
        """The earliest arrived message that a receive (source, tag) would match, or None."""
        self.progress()
        for u in self.unexpected:
            if _matches(u.ctx, u.src, u.tag, ctx, source, tag):
                return u
        return None

    def cancel(self, req: Request) -> bool:
        """Cancel a receive that has not matched yet, or withdraw a rendezvous send.

        A send is withdrawn while its payload has not been handed over (no CTS or FIN has
        arrived; frames that have are taken in first): see the module docstring for the
        CANCEL/NAK exchange and its one race. Eager sends, completed requests and matched
        receives are left alone.

        Returns:
            True when ``req`` was cancelled (it is then complete, ``cancelled`` set).
        """
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
        sid = next((k for k, v in self._sends.items() if v is req), None)
        if sid is None:
            return False
        self._withdraw(sid, req)
        req.cancelled = True
        req._complete()
        return True

    def _withdraw(self, sid: int, req: Request) -> None:
        """Forget rendezvous send ``sid``: revoke its buffer, tell the receiver (CANCEL)."""
        del self._sends[sid]
        self._release(sid, revoke=True)
        self._withdrawn.add(sid)
        if self._polling:               # inside a delivery: after it (an ABORT goes first)
            self._emit(req.peer, _pack((CANCEL, sid)), quiet=True)
            return
        try:
            self.route[req.peer].send(req.peer, _pack((CANCEL, sid)), None, None)
        except TransportError:          # the peer is gone: nothing can read the buffer now
            self._withdrawn.discard(sid)

    # -- abandoned collective calls -------------------------------------------------------
    def abort_call(self, ctx: int, tag: int, peers, error: CollectiveError,
                   text: str) -> None:
        """Abandon collective call ``(ctx, tag)`` here and tell ``peers`` (world ranks).

        Fails this rank's pending requests of the call with ``error``, remembers the call
        as abandoned, and sends every peer an ABORT frame carrying ``text`` (which names
        this rank, the call and why). Peers that are gone are skipped. Idempotent.
        """
        if (ctx, tag) in self.aborted:
            return
        if self.lock is not None:       # the progress thread may abandon a call too
            with self.lock:
                return self._abort_call(ctx, tag, peers, error, text)
        return self._abort_call(ctx, tag, peers, error, text)

    def _abort_call(self, ctx, tag, peers, error, text) -> None:
        # tell the peers first: a peer whose read of a withdrawn send fails (below) then
        # finds the reason already in its queue
        frame = _pack((ABORT, ctx, tag, isinstance(error, CollectiveMismatchError), text))
        for p in peers:
            if p != self.rank:          # (a dead peer learns nothing more from us)
                self._emit(p, frame, quiet=True)
        self._fail_call(ctx, tag, error)

    def aborted_error(self, ctx: int, tag: int) -> CollectiveError | None:
        """The error of call ``(ctx, tag)`` if a rank abandoned it, else None."""
        return self.aborted.get((ctx, tag)) if self.aborted else None

    def _fail_call(self, ctx: int, tag: int, error: CollectiveError) -> None:
        aborted = self.aborted
        aborted[(ctx, tag)] = error
        self.abort_count += 1
        if len(aborted) > _ABORTED_KEEP:
            del aborted[next(iter(aborted))]
        for r in [r for r in self.posted if r.ctx == ctx and r.tag == tag]:
            self.posted.remove(r)
            r.error = error
            r._complete()
        # arrived or arriving eager messages of the call are dropped; announced large ones
        # stay until their sender, which abandons the call too, withdraws them (CANCEL)
        kept = []
        for u in self.unexpected:
            if u.ctx == ctx and u.tag == tag and u.kind == EAGER:
                if u.sig is not None:
                    self._unqueued(u)
            else:
                kept.append(u)
        self.unexpected = kept
        for rid, r in list(self._recvs.items()):
            if r.ctx == ctx and r.tag == tag and not r.done:
                r.error = error         # its DATA, if it still comes, lands and is ignored
                r._complete()
        for sid, r in list(self._sends.items()):
            if r.ctx == ctx and r.tag == tag:
                self._withdraw(sid, r)
                r.error = error
                r._complete()

    def _send_ctl(self, peer: int, frame: tuple) -> None:
        self._emit(peer, _pack(frame))

    def foreign_message(self, ctx: int, tag: int, sig, peer: int, nbytes: int) -> bool:
        """Whether an unmatched collective message proves a mismatch; if so, abandon calls.

        Such a message (``sig`` from world rank ``peer``) is checked against this
        communicator's latest call: one of that call with another signature, or one of a
        call this rank has finished (none of its nonblocking calls being in flight), shows
        that the ranks run different calls. A receive may never match it (the ranks
        exchange with other partners in the calls they run), so both would wait out the
        timeout; instead the message's call, the one after it and this rank's current call
        are abandoned on every rank (a rank that had finished them learns in its next
        call: see :meth:`pycomm.calls.CollectiveCalls.check_late_abort`).
        """
        seq, mine, world = self.current[ctx]
        if tag == seq:
            if mine == sig or empty_match(mine, sig, nbytes):
                return False
            text = (f"collective mismatch in call #{tag}: world rank {peer} is in "
                    f"{describe(sig)}, world rank {self.rank} in {describe(mine)}")
        elif 0 < (seq - tag) & 0x7FFFFFFF < 1 << 30 and ctx not in self.unordered and \
                self.offload_posted == self.offload_done and (ctx, tag) not in self.aborted:
            text = (f"collective mismatch in call #{tag}: world rank {peer} sent a message "
                    f"of {describe(sig)} for a call world rank {self.rank} has finished "
                    f"(it is in call #{seq}, {describe(mine)})")
        else:
            return False
        # the message's call, the next one (as CollectiveCalls.abandon does for a mismatch:
        # a rank that needed nothing from the others may be in it), and this rank's own
        for t in dict.fromkeys((tag, (tag + 1) & 0x7FFFFFFF, seq)):
            note = text if t == tag else f"call #{t} is abandoned after a {text}"
            self.abort_call(ctx, t, world, CollectiveMismatchError(f"rank {self.rank}: {note}"),
                            note)
        return True

    def _mismatch(self, req: Request, src: int, tag: int, nbytes: int, theirs) -> None:
        """Fail ``req``: the message from world rank ``src`` belongs to another call."""
        req.source, req.tag, req.count = src, tag, nbytes
        err = CollectiveMismatchError(
            f"rank {self.rank}: collective call #{tag}: world rank {src} is in "
            f"{describe(theirs)}, world rank {self.rank} in {describe(req.sig)}")
        err.peer, err.theirs, err.mine = src, theirs, req.sig
        req.error = err
        req._complete()

    # -- matching helpers -----------------------------------------------------------------
    def _dest_for(self, req: Request, src: int, tag: int, nbytes: int):
        req.source, req.tag, req.count = src, tag, nbytes
        if req.view is None:
            req.obj = bytearray(nbytes)
            return memoryview(req.obj)
        if nbytes > req.nbytes:
            req.error = TruncationError(
                f"rank {self.rank}: message of {nbytes} bytes from rank {src} (tag {tag}) "
                f"is larger than the receive buffer of {req.nbytes} bytes")
            return memoryview(bytearray(nbytes))
        return req.view[:nbytes] if nbytes != req.nbytes else req.view

    def _queue(self, u: _Unexpected) -> None:
        """Keep an arrived message no receive has matched yet (see :attr:`coll_tags`)."""
        self.unexpected.append(u)
        if u.sig is not None:
            entry = self.coll_tags.get((u.ctx, u.tag))
            if entry is None:
                self.coll_tags[(u.ctx, u.tag)] = [1, u.sig]
            else:
                entry[0] += 1
                if entry[1] != u.sig:
                    entry[1] = MIXED

    def _unqueued(self, u: _Unexpected) -> None:
        """Account for collective message ``u`` having left :attr:`unexpected`."""
        key = (u.ctx, u.tag)
        entry = self.coll_tags.get(key)
        if entry is not None:
            entry[0] -= 1
            if entry[0] <= 0:
                del self.coll_tags[key]

    def _take_unexpected(self, req: Request, u: _Unexpected) -> None:
        if u.kind == EAGER:
            dest = self._dest_for(req, u.src, u.tag, u.nbytes)
            if u.arrived:
                if u.nbytes:
                    dest[:] = u.buf
                req._complete()
                if u.sender is not None:        # a synchronous send to this rank
                    u.sender._complete()
            else:
                u.matched = req            # payload still streaming in; finish on arrival
        else:
            self._start_rndv(req, u.src, u.tag, u.nbytes, u.sid, u.desc)

    def _start_rndv(self, req, src, tag, nbytes, sid, desc) -> None:
        t = self.route[src]
        dest = self._dest_for(req, src, tag, nbytes)
        if req.error is not None:        # truncated: release the sender, fail the receive
            self._emit(src, _pack((FIN, sid)))
            req._complete()
            return
        if desc is not None and t.can_read(src):
            if self._polling:
                self.outbox.append((_READ, src, desc, nbytes, dest, req, sid, tag))
            else:
                self._read_rndv(src, desc, nbytes, dest, req, sid, tag)
            return
        rid = self._next_id
        self._next_id += 1
        self._recvs[rid] = req
        req.view = dest
        self._emit(src, _pack((CTS, sid, rid)))

    def _read_rndv(self, src, desc, nbytes, dest, req, sid, tag) -> None:
        """Copy a large message straight from the sender's buffer; FIN releases it."""
        t = self.route[src]
        try:
            t.read_remote(src, desc, nbytes, dest)
        except RemoteAccessError:
            # the sender withdrew the buffer while we read it (a Send that timed out, a
            # Cancel): the bytes may be the caller's later ones, so fail the receive
            req.error = CommError(
                f"rank {self.rank}: the message of {nbytes} bytes from rank {src} "
                f"(tag {tag}) was withdrawn by its sender while it was being read "
                "(its Send timed out or was cancelled)")
        t.send(src, _pack((FIN, sid)), None, None)
        req._complete()

    # -- actions: what the sink callbacks decided, carried out after the transport returns
    def _emit(self, peer: int, header: bytes, payload=None, req=None, quiet=False) -> None:
        """Send a frame now, or, inside a transport's delivery, once it has returned.
        ``req``: completed when the transport has taken the payload; ``quiet``: a dead
        peer is ignored (an ABORT to a rank that died learns it nothing)."""
        if self._polling:
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
                self._read_rndv(*action[1:])

    def _deliver_local(self, view: memoryview, ctx: int, tag: int, sig) -> _Unexpected | None:
        """Deliver a message to this rank itself: into a posted receive (returns None) or
        as an unexpected message (returned)."""
        n = len(view)
        for i, r in enumerate(self.posted):
            if _matches(ctx, self.rank, tag, r.ctx, r.peer, r.tag):
                del self.posted[i]
                if r.sig != sig and not empty_match(r.sig, sig, n):
                    self._mismatch(r, self.rank, tag, n, sig)
                    return
                dest = self._dest_for(r, self.rank, tag, n)
                if n:
                    dest[:] = view
                r._complete()
                return None
        u = _Unexpected(ctx, self.rank, tag, n, EAGER, sig)
        u.buf = bytearray(view)
        u.arrived = True
        self._queue(u)
        return u

    # -- Sink: called by transports inside progress() -------------------------------------
    def on_frame(self, peer: int, header: bytes, payload: memoryview) -> None:
        """A whole frame at once: a point-to-point eager message that a posted receive
        matches is copied straight into it; anything else goes through :meth:`on_header`
        and :meth:`on_payload`."""
        h = _HEADERS.get(header)        # cached: point-to-point eager headers only
        if h is not None:
            ctx, tag = h[1], h[2]
            posted = self.posted
            for i, r in enumerate(posted):
                if r.ctx == ctx and (r.peer == peer or r.peer == ANY_SOURCE) and \
                        (r.tag == tag or (r.tag == ANY_TAG and tag >= 0)):
                    if r.sig is not None:
                        break
                    del posted[i]
                    n = len(payload)
                    if n == r.nbytes and r.on_done is None:     # _dest_for, _complete
                        r.source, r.tag, r.count = peer, tag, n
                        r.view[:] = payload
                        r.done = True
                        return
                    dest = self._dest_for(r, peer, tag, n)
                    if n:
                        dest[:n] = payload
                    r._complete()
                    return
        n = len(payload)
        dest = self.on_header(peer, header, n)
        if n:
            dest[:n] = payload
        self.on_payload(peer)

    def on_header(self, peer: int, header: bytes, nbytes: int):
        h = _HEADERS.get(header)
        if h is None:
            h = _unpack(header)
            # point-to-point eager headers repeat: cache them (a collective's carries its
            # call number, which never repeats, and would only fill the cache); a full
            # cache starts again, as _EAGER_HEADERS does, so that a program that went
            # through many tags keeps the fast path (on_frame's) for the ones it uses now
            if h[0] == EAGER and len(h) == 3:
                if len(_HEADERS) >= 4096:
                    _HEADERS.clear()
                _HEADERS[header] = h
        kind = h[0]
        if kind == EAGER:
            ctx, tag = h[1], h[2]
            sig = (h[3], h[4]) if len(h) > 3 else None
            posted = self.posted
            for i, r in enumerate(posted):
                if r.ctx == ctx and (r.peer == peer or r.peer == ANY_SOURCE) and \
                        (r.tag == tag or (r.tag == ANY_TAG and tag >= 0)):
                    del posted[i]
                    if r.sig != sig and not empty_match(r.sig, sig, nbytes):
                        self._mismatch(r, peer, tag, nbytes, sig)
                        return memoryview(bytearray(nbytes))    # discarded
                    self._incoming[peer] = r
                    return self._dest_for(r, peer, tag, nbytes)
            if self.aborted and (ctx, tag) in self.aborted:
                return memoryview(bytearray(nbytes))            # late: discarded
            if sig is not None and ctx in self.current and \
                    self.foreign_message(ctx, tag, sig, peer, nbytes):
                return memoryview(bytearray(nbytes))            # its call is abandoned
            u = _Unexpected(ctx, peer, tag, nbytes, EAGER, sig)
            u.buf = bytearray(nbytes)
            self._queue(u)
            self._incoming[peer] = u
            return memoryview(u.buf)
        if kind == RTS:
            ctx, tag, n, sid, desc = h[1:6]
            sig = (h[6], h[7]) if len(h) > 6 else None
            for i, r in enumerate(self.posted):
                if _matches(ctx, peer, tag, r.ctx, r.peer, r.tag):
                    del self.posted[i]
                    if r.sig != sig and not empty_match(r.sig, sig, n):
                        self._mismatch(r, peer, tag, n, sig)
                        self._send_ctl(peer, (FIN, sid))
                        return None
                    self._start_rndv(r, peer, tag, n, sid, desc)
                    return None
            if sig is not None and ctx in self.current and \
                    self.foreign_message(ctx, tag, sig, peer, n):
                self._send_ctl(peer, (FIN, sid))                # not to be read
                return None
            u = _Unexpected(ctx, peer, tag, n, RTS, sig)
            u.sid, u.desc = sid, desc
            self._queue(u)
            return None
        if kind == CTS:
            if h[1] in self._withdrawn:
                self._withdrawn.discard(h[1])
                self._emit(peer, _pack((NAK, h[2])))
                return None
            req = self._sends.pop(h[1])
            self._release(h[1])
            self._emit(peer, _pack((DATA, h[2])), req.view, req)
            return None
        if kind == DATA:
            req = self._recvs.pop(h[1])
            self._incoming[peer] = req
            return req.view
        if kind == FIN:
            if h[1] in self._withdrawn:
                self._withdrawn.discard(h[1])
                return None
            req = self._sends.pop(h[1], None)
            if req is not None:             # None: a second FIN for a withdrawn message
                req._complete()
                self._release(h[1])
            return None
        if kind == CANCEL:
            for i, u in enumerate(self.unexpected):
                if u.kind == RTS and u.src == peer and u.sid == h[1]:
                    del self.unexpected[i]
                    if u.sig is not None:
                        self._unqueued(u)
                    break
            # answered whether or not it was found (read already, or dropped with an
            # abandoned call): the sender then forgets the message
            self._emit(peer, _pack((FIN, h[1])))
            return None
        if kind == NAK:
            req = self._recvs.pop(h[1])
            req.error = CommError(f"rank {self.rank}: the message of {req.count} bytes from "
                                  f"rank {peer} (tag {req.tag}) was withdrawn by its sender "
                                  "(its Send timed out or was cancelled)")
            req._complete()
            return None
        if kind == ABORT:
            _, ctx, tag, mismatch, text = h
            if (ctx, tag) not in self.aborted:
                cls = CollectiveMismatchError if mismatch else CollectiveError
                err = cls(f"rank {self.rank}: {text}")
                err.origin = peer
                self._fail_call(ctx, tag, err)
            return None
        raise TransportError(f"rank {peer} sent an unknown frame kind {kind!r}")

    def _release(self, sid: int, revoke: bool = False) -> None:
        exposed = self._exposed.pop(sid, None)
        if exposed is not None:
            exposed[0].release(exposed[1], revoke=revoke)

    def on_payload(self, peer: int) -> None:
        x = self._incoming.pop(peer, None)
        if x is None:                   # a control frame (RTS, CTS, FIN) has no payload
            return
        if type(x) is Request:
            x._complete()
            return
        x.arrived = True
        req = x.matched
        if req is not None:
            if x.nbytes:
                self._dest_for(req, x.src, x.tag, x.nbytes)[:] = x.buf
            req._complete()

    def on_sent(self, token) -> None:
        token._complete()

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
