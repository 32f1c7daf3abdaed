"""Point-to-point engine: tag matching, requests, progress, eager and rendezvous protocols.

The engine sits between the communicator and the transports. It speaks in world ranks and
context ids (one per communicator and traffic class) and implements
:class:`transports.base.Sink`.

Protocols (header = msgpack list; the first item is the frame kind):

======== ====================================== ==========================================
kind      header                                 meaning
======== ====================================== ==========================================
EAGER    [0, ctx, tag]          + payload        the whole message (<= eager limit)
RTS      [1, ctx, tag, nbytes, sid, desc]        request to send a large message
CTS      [2, sid, rid]                           receiver matched it: stream into rid
DATA     [3, rid]               + payload        the large message, landing in place
FIN      [4, sid]                                receiver copied it one-sidedly: sender done
CANCEL   [5, sid]                                sender withdraws its RTS (a Send that timed
                                                 out, or Request.Cancel on a pending send)
NAK      [6, rid]                                answer to a CTS for a withdrawn message
======== ====================================== ==========================================

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
sender. The one race left: a receiver reading the buffer one-sidedly at the very moment the
sender withdraws it may copy bytes the caller is already overwriting.

Matching follows MPI: a receive matches the earliest arrived message with the same
context, a matching source (or ANY_SOURCE) and tag (or ANY_TAG); messages between a pair
never overtake each other, since transports deliver in order.

Progress and waiting (spin, then sleep in the kernel; liveness checks; the lock a second
thread needs) are :class:`pycomm.waiting.Waiting`, which the engine inherits.
"""

from __future__ import annotations

from typing import Any

import msgpack

from transports import TransportError

from .errors import CommError, PeerError, TruncationError
from .request import Request
from .waiting import Waiting, default_spin_seconds, default_yield_seconds

__all__ = ["Engine", "Request", "ANY_SOURCE", "ANY_TAG", "PROC_NULL",
           "default_spin_seconds", "default_yield_seconds"]

ANY_SOURCE = -2
ANY_TAG = -1
PROC_NULL = -1

EAGER, RTS, CTS, DATA, FIN, CANCEL, NAK = 0, 1, 2, 3, 4, 5, 6
_pack = msgpack.packb
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
                 "matched")

    def __init__(self, ctx, src, tag, nbytes, kind):
        self.ctx, self.src, self.tag, self.nbytes, self.kind = ctx, src, tag, nbytes, kind
        self.buf: bytearray | None = None
        self.arrived = False
        self.sid = 0
        self.desc = None
        self.matched: Request | None = None


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
        self._incoming: dict[int, Any] = {}
        self._sends: dict[int, Request] = {}
        self._recvs: dict[int, Request] = {}
        self._exposed: dict[int, tuple] = {}     # sid -> (transport, descriptor)
        self._withdrawn: set[int] = set()         # sids of cancelled sends (see cancel)
        self._next_id = 1
        self.next_cid = 1                         # context ids: see pycomm.groups
        self.oversubscription = 1.0               # agreed ranks per core (bootstrap)
        self.min_cores = 1
        self._failed: PeerError | None = None
        self._threaded = False
        self._yield_gil = False       # spinning waiters must yield the GIL (a transport thread)
        self.offload_running = 0      # collectives the progress thread is running now
        self.offload_ident = None     # that thread's threading.get_ident()
        self.lock = None

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
    def isend(self, view: memoryview, dest: int, ctx: int, tag: int) -> Request:
        """Start sending the bytes of ``view`` to world rank ``dest``; returns a Request."""
        req = Request(self, view, ctx, dest, tag)
        req.expect = -2                 # marks a send
        if dest == self.rank:
            self._deliver_local(view, ctx, tag)
            req._complete()
            return req
        t = self.route[dest]
        n = len(view)
        try:
            if n <= self.eager_limit:
                hdr = _EAGER_HEADERS.get((ctx, tag))
                if hdr is None:
                    hdr = _eager_header(ctx, tag)
                if t.send(dest, hdr, view, req):
                    req._complete()
            else:
                sid = self._next_id
                self._next_id += 1
                self._sends[sid] = req
                desc = t.expose(view) if t.one_sided_read else None
                if desc is not None:
                    self._exposed[sid] = (t, desc)
                t.send(dest, _pack((RTS, ctx, tag, n, sid, desc)), None, None)
        except TransportError as exc:
            raise self._peer_error(exc) from None
        return req

    def irecv(self, view: memoryview | None, source: int, ctx: int, tag: int) -> Request:
        """Post a receive into ``view`` (None: allocate a bytearray of the message's size)."""
        req = Request(self, view, ctx, source, tag)
        unexpected = self.unexpected
        for i, u in enumerate(unexpected):
            if _matches(u.ctx, u.src, u.tag, ctx, source, tag):
                del unexpected[i]
                self._take_unexpected(req, u)
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
        try:
            self.progress()             # take in a CTS or FIN that has arrived already
        except PeerError:
            pass                        # the peer is gone; withdrawing is still right
        sid = next((k for k, v in self._sends.items() if v is req), None)
        if sid is None:
            return False
        del self._sends[sid]
        self._release(sid)
        self._withdrawn.add(sid)
        try:
            self.route[req.peer].send(req.peer, _pack((CANCEL, sid)), None, None)
        except TransportError:          # the peer is gone: nothing can read the buffer now
            self._withdrawn.discard(sid)
        req.cancelled = True
        req._complete()
        return True

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

    def _take_unexpected(self, req: Request, u: _Unexpected) -> None:
        if u.kind == EAGER:
            dest = self._dest_for(req, u.src, u.tag, u.nbytes)
            if u.arrived:
                if u.nbytes:
                    dest[:] = u.buf
                req._complete()
            else:
                u.matched = req            # payload still streaming in; finish on arrival
        else:
            self._start_rndv(req, u.src, u.tag, u.nbytes, u.sid, u.desc)

    def _start_rndv(self, req, src, tag, nbytes, sid, desc) -> None:
        t = self.route[src]
        dest = self._dest_for(req, src, tag, nbytes)
        if req.error is not None:        # truncated: release the sender, fail the receive
            t.send(src, _pack((FIN, sid)), None, None)
            req._complete()
            return
        if desc is not None and t.can_read(src):
            t.read_remote(src, desc, nbytes, dest)
            t.send(src, _pack((FIN, sid)), None, None)
            req._complete()
            return
        rid = self._next_id
        self._next_id += 1
        self._recvs[rid] = req
        req.view = dest
        t.send(src, _pack((CTS, sid, rid)), None, None)

    def _deliver_local(self, view: memoryview, ctx: int, tag: int) -> None:
        n = len(view)
        for i, r in enumerate(self.posted):
            if _matches(ctx, self.rank, tag, r.ctx, r.peer, r.tag):
                del self.posted[i]
                dest = self._dest_for(r, self.rank, tag, n)
                if n:
                    dest[:] = view
                r._complete()
                return
        u = _Unexpected(ctx, self.rank, tag, n, EAGER)
        u.buf = bytearray(view)
        u.arrived = True
        self.unexpected.append(u)

    # -- Sink: called by transports inside progress() -------------------------------------
    def on_header(self, peer: int, header: bytes, nbytes: int):
        h = _HEADERS.get(header)
        if h is None:
            h = _unpack(header)
            if h[0] == EAGER and len(_HEADERS) < 4096:   # eager headers repeat: cache them
                _HEADERS[header] = h
        kind = h[0]
        if kind == EAGER:
            ctx, tag = h[1], h[2]
            posted = self.posted
            for i, r in enumerate(posted):
                if r.ctx == ctx and (r.peer == peer or r.peer == ANY_SOURCE) and \
                        (r.tag == tag or (r.tag == ANY_TAG and tag >= 0)):
                    del posted[i]
                    self._incoming[peer] = r
                    return self._dest_for(r, peer, tag, nbytes)
            u = _Unexpected(ctx, peer, tag, nbytes, EAGER)
            u.buf = bytearray(nbytes)
            self.unexpected.append(u)
            self._incoming[peer] = u
            return memoryview(u.buf)
        if kind == RTS:
            _, ctx, tag, n, sid, desc = h
            for i, r in enumerate(self.posted):
                if _matches(ctx, peer, tag, r.ctx, r.peer, r.tag):
                    del self.posted[i]
                    self._start_rndv(r, peer, tag, n, sid, desc)
                    return None
            u = _Unexpected(ctx, peer, tag, n, RTS)
            u.sid, u.desc = sid, desc
            self.unexpected.append(u)
            return None
        if kind == CTS:
            if h[1] in self._withdrawn:
                self._withdrawn.discard(h[1])
                self.route[peer].send(peer, _pack((NAK, h[2])), None, None)
                return None
            req = self._sends.pop(h[1])
            self._release(h[1])
            if self.route[peer].send(peer, _pack((DATA, h[2])), req.view, req):
                req._complete()
            return None
        if kind == DATA:
            req = self._recvs.pop(h[1])
            self._incoming[peer] = req
            return req.view
        if kind == FIN:
            if h[1] in self._withdrawn:
                self._withdrawn.discard(h[1])
                return None
            self._sends.pop(h[1])._complete()
            self._release(h[1])
            return None
        if kind == CANCEL:
            for i, u in enumerate(self.unexpected):
                if u.kind == RTS and u.src == peer and u.sid == h[1]:
                    del self.unexpected[i]
                    self.route[peer].send(peer, _pack((FIN, h[1])), None, None)
                    break
            return None
        if kind == NAK:
            req = self._recvs.pop(h[1])
            req.error = CommError(f"rank {self.rank}: the message of {req.count} bytes from "
                                  f"rank {peer} (tag {req.tag}) was withdrawn by its sender "
                                  "(its Send timed out or was cancelled)")
            req._complete()
            return None
        raise TransportError(f"rank {peer} sent an unknown frame kind {kind!r}")

    def _release(self, sid: int) -> None:
        exposed = self._exposed.pop(sid, None)
        if exposed is not None:
            exposed[0].release(exposed[1])

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
        kind = "send to" if req.expect == -2 else "receive from"
        peer = "any rank" if req.peer == ANY_SOURCE else f"rank {req.peer}"
        return (f"rank {self.rank}: {kind} {peer} (tag {req.tag}) did not complete within "
                f"{limit:g} s; is the peer posting the matching call? (PYCOMM_TIMEOUT)")
