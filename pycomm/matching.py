"""Matching: the half of the p2p engine that messages arrive in.

Matching follows MPI: a receive matches the earliest arrived message with the same
context, a matching source (or ANY_SOURCE) and tag (or ANY_TAG); messages between a pair
never overtake each other, since transports deliver in order. An arriving message that a
posted receive matches lands in that receive's buffer; one that none matches yet waits in
the engine's ``unexpected`` queue until a receive takes it (:meth:`pycomm.p2p.Engine.irecv`),
and the collective messages there are counted per call in ``coll_tags``, which the
checks at each collective call's start and end read (:mod:`pycomm.calls`).

Eager: the sender's buffer is free as soon as the transport has copied it out. The
receiver lands the payload in the posted buffer if a receive matches, otherwise in an
unexpected-message buffer (one extra copy when the receive is posted later). A whole frame
(:meth:`Matching.on_frame`) of a point-to-point message that a posted receive matches is
copied straight into it; the engine parses each point-to-point header once
(:mod:`pycomm.wire`'s caches).

:class:`Matching` holds the transports' callbacks (:class:`transports.base.Sink`), which
only decide: the frames they answer with and the one-sided reads they start wait in the
engine's outbox until the transport has returned (see :mod:`pycomm.p2p`, "Actions"). A
large message's arrival (RTS) is matched here like any other, and its transfer is the
rendezvous protocol's (:mod:`pycomm.rendezvous`); a collective message is checked against
its receive's signature, or, unmatched, against this rank's current call
(:meth:`pycomm.aborts.CallAborts.foreign_message`).
"""

from __future__ import annotations

from .errors import ProtocolError, TruncationError
from .request import Request
from .signature import empty_match
from .wire import ABORT, CANCEL, CTS, DATA, EAGER, FIN, NAK, RTS, _HEADERS, _unpack

__all__ = ["Matching", "ANY_SOURCE", "ANY_TAG"]

ANY_SOURCE = -2
ANY_TAG = -1
MIXED = object()        # Engine.coll_tags: messages of one call with different signatures


class _Unexpected:
    """An arrived message that no receive has matched yet: an eager one (its payload in
    ``buf``, complete once ``arrived``) or a large one's RTS (``sid``, ``desc``)."""

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


def _matches(ctx, src, tag, r_ctx, r_src, r_tag) -> bool:
    return r_ctx == ctx and (r_src == src or r_src == ANY_SOURCE) and \
        (r_tag == tag or (r_tag == ANY_TAG and tag >= 0))


class Matching:
    """The half of :class:`pycomm.p2p.Engine` that messages arrive in (see the module
    docstring); its state is the engine's: ``posted``, ``unexpected``, ``coll_tags``,
    ``_incoming`` (per peer: the receive or unexpected message a payload streams into),
    with the engine's ``rndv`` and abandoned calls."""

    # -- matching helpers -----------------------------------------------------------------
    def _dest_for(self, req: Request, src: int, tag: int, nbytes: int):
        req.source, req.tag, req.count = src, tag, nbytes
        if req.view is None:
            req.obj = bytearray(nbytes)
            return memoryview(req.obj)
        if nbytes > req.nbytes:
            self._truncate(req, src, tag, nbytes)
            # the whole message (an eager one, at most the eager limit: a large one is
            # asked for its head only, Rendezvous.start) lands in a scratch buffer; its
            # head goes into the receive buffer when the receive completes
            scratch = memoryview(bytearray(nbytes))
            view, error, chained = req.view, req.error, req.on_done

            def keep_head(r):
                if r.error is error:    # (a withdrawn message's bytes are not kept)
                    view[:] = scratch[:len(view)]
                if chained is not None:
                    chained(r)
            req.on_done = keep_head
            return scratch
        return req.view[:nbytes] if nbytes != req.nbytes else req.view

    def _truncate(self, req: Request, src: int, tag: int, nbytes: int) -> None:
        """Fail receive ``req`` of a message of ``nbytes``, more than its buffer holds. As
        in MPI, what fits is received: the caller puts the message's head in the buffer,
        and the status counts those bytes (MPICH's and Open MPI's answer)."""
        req.source, req.tag = src, tag
        req.error = TruncationError(
            f"rank {self.rank}: message of {nbytes} bytes from rank {src} (tag {tag}) "
            f"is larger than the receive buffer of {req.nbytes} bytes")
        req.count = req.nbytes

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
            self.rndv.start(req, u.src, u.tag, u.nbytes, u.sid, u.desc)

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
                        self.rndv.decline(peer, sid)
                        return None
                    self.rndv.start(r, peer, tag, n, sid, desc)
                    return None
            if sig is not None and ctx in self.current and \
                    self.foreign_message(ctx, tag, sig, peer, n):
                self.rndv.decline(peer, sid)                    # not to be read
                return None
            u = _Unexpected(ctx, peer, tag, n, RTS, sig)
            u.sid, u.desc = sid, desc
            self._queue(u)
            return None
        if kind == CTS:
            self.rndv.on_cts(peer, h[1], h[2], h[3])
            return None
        if kind == DATA:
            req = self.rndv.on_data(h[1])
            self._incoming[peer] = req
            return req.view
        if kind == FIN:
            self.rndv.on_fin(h[1])
            return None
        if kind == CANCEL:
            self.rndv.on_cancel(peer, h[1])
            return None
        if kind == NAK:
            self.rndv.on_nak(peer, h[1])
            return None
        if kind == ABORT:
            self._on_abort(peer, h)
            return None
        raise ProtocolError(f"rank {peer} sent an unknown frame kind {kind!r}")

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
