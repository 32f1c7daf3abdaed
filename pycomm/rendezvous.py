"""The rendezvous protocol: how the p2p engine moves a large message, and withdraws one.

Rendezvous (messages above ``PYCOMM_EAGER_LIMIT`` bytes, and synchronous-mode sends at any
size): the sender announces the message (RTS, with a descriptor of its buffer,
``transport.expose(view)``, when the transport can be read one-sidedly: an address for
cross-memory attach, (address, rkey) for RDMA) and keeps the buffer. When a receive
matches, the receiver either copies the sender's buffer directly into its own with the
transport's one-sided read and answers FIN (shm + cross-memory attach: one copy in all),
or answers CTS and the sender streams the payload, which the transport lands directly in
the posted buffer (no extra copy: the payload is never staged as an unexpected message).
The same pattern as MPICH's LMT and Open MPI's ob1 PML. The frames (RTS, CTS, DATA, FIN,
CANCEL, NAK) are in :mod:`pycomm.wire`.

Withdrawing a large send (:meth:`pycomm.p2p.Engine.cancel`; a blocking ``Send`` does it
when it times out, so that its buffer, handed back to the caller, is never read
afterwards): the sender forgets the message and sends CANCEL. A receiver that has not
matched the RTS drops it and answers FIN, so the message is never received. One that
matched it already either copied it (its FIN is then discarded) or is waiting for the
payload: the sender answers its CTS with NAK, and that receive fails with a
:class:`~pycomm.errors.CommError` naming the sender. A receiver reading the buffer
one-sidedly at the very moment the sender withdraws it cannot copy bytes the caller is
already overwriting: the transport's read checks the exposure's validity word before and
after the copy (a sequence lock; see ``Transport.expose``), and a read that overlapped the
withdrawal fails the receive with that same error instead.

Division of labour: the engine (:mod:`pycomm.p2p`) matches, an arriving RTS against the
posted receives as any message (or it keeps the RTS as an unexpected message), and hands
a matched one to :meth:`Rendezvous.start`; the engine's :class:`Rendezvous` (its
``rndv``) holds the large sends and receives in flight and answers the protocol's frames.
What it decides inside a transport's delivery (a frame, a one-sided read) goes to the
engine's outbox like any of its actions (:meth:`pycomm.p2p.Engine.act`).
"""

from __future__ import annotations

from transports import RemoteAccessError, TransportError

from .errors import CommError
from .request import Request
from .wire import CANCEL, CTS, DATA, FIN, NAK, RTS, _pack

__all__ = ["Rendezvous", "READ"]

READ = "read"           # kind of an Engine.outbox action: a one-sided read (Rendezvous.read)


class Rendezvous:
    """The large messages in flight of one engine, and the protocol that moves them.

    Attributes:
        engine: the :class:`pycomm.p2p.Engine` that holds it (as ``rndv``).
        sends: sid -> a send announced by RTS whose payload has not been handed over (no
            CTS or FIN yet).
        recvs: rid -> a receive that answered CTS, waiting for its DATA (or NAK).
        exposed: sid -> (transport, descriptor) of a send buffer readable one-sidedly.
        withdrawn: sids of sends withdrawn before their CTS or FIN arrived.
        next_id: the next sid or rid.
    """

    def __init__(self, engine):
        self.engine = engine
        self.sends: dict[int, Request] = {}
        self.recvs: dict[int, Request] = {}
        self.exposed: dict[int, tuple] = {}     # sid -> (transport, descriptor)
        self.withdrawn: set[int] = set()         # sids of cancelled sends (see withdraw)
        self.next_id = 1

    # -- the sender -----------------------------------------------------------------------
    def announce(self, t, dest: int, view: memoryview, n: int, req: Request, ctx: int,
                 tag: int, sig) -> None:
        """Send RTS for ``req`` (``n`` bytes of ``view``) to world rank ``dest`` through
        transport ``t``, exposing the buffer when ``t`` can be read one-sidedly.

        Raises:
            TransportError: the link to ``dest`` failed.
        """
        sid = self.next_id
        self.next_id += 1
        self.sends[sid] = req
        desc = t.expose(view) if t.one_sided_read else None
        if desc is not None:
            self.exposed[sid] = (t, desc)
        t.send(dest, _pack((RTS, ctx, tag, n, sid, desc) if sig is None else
                           (RTS, ctx, tag, n, sid, desc, sig[0], sig[1])),
               None, None)

    def on_cts(self, peer: int, sid: int, rid: int, nbytes: int) -> None:
        """CTS: stream the first ``nbytes`` of send ``sid`` (the whole message, or the head
        that fits a truncating receive) into ``peer``'s receive ``rid`` (NAK if the send
        was withdrawn)."""
        if sid in self.withdrawn:
            self.withdrawn.discard(sid)
            self.engine._emit(peer, _pack((NAK, rid)))
            return
        req = self.sends.pop(sid)
        self.release(sid)
        view = req.view
        self.engine._emit(peer, _pack((DATA, rid)),
                          view if nbytes >= view.nbytes else view[:nbytes], req)

    def on_fin(self, sid: int) -> None:
        """FIN: the receiver has copied send ``sid`` (or dropped it): the send is done."""
        if sid in self.withdrawn:
            self.withdrawn.discard(sid)
            return
        req = self.sends.pop(sid, None)
        if req is not None:             # None: a second FIN for a withdrawn message
            req._complete()
            self.release(sid)

    def withdraw(self, req: Request) -> bool:
        """Withdraw send ``req`` if its payload has not been handed over (see the module
        docstring); False when it is not (or no longer) announced here."""
        sid = next((k for k, v in self.sends.items() if v is req), None)
        if sid is None:
            return False
        self._withdraw(sid, req)
        return True

    def _withdraw(self, sid: int, req: Request) -> None:
        """Forget rendezvous send ``sid``: revoke its buffer, tell the receiver (CANCEL)."""
        eng = self.engine
        del self.sends[sid]
        self.release(sid, revoke=True)
        self.withdrawn.add(sid)
        if eng._polling:                # inside a delivery: after it (an ABORT goes first)
            eng._emit(req.peer, _pack((CANCEL, sid)), quiet=True)
            return
        try:
            eng.route[req.peer].send(req.peer, _pack((CANCEL, sid)), None, None)
        except TransportError:          # the peer is gone: nothing can read the buffer now
            self.withdrawn.discard(sid)

    def release(self, sid: int, revoke: bool = False) -> None:
        """Stop exposing send ``sid``'s buffer (``revoke``: reads in progress must fail)."""
        exposed = self.exposed.pop(sid, None)
        if exposed is not None:
            exposed[0].release(exposed[1], revoke=revoke)

    # -- the receiver ---------------------------------------------------------------------
    def start(self, req: Request, src: int, tag: int, nbytes: int, sid: int, desc) -> None:
        """Receive ``req`` has matched the RTS ``sid`` from world rank ``src``: read the
        sender's buffer one-sidedly (``desc``) where the transport can, else answer CTS."""
        eng = self.engine
        t = eng.route[src]
        if req.view is not None and nbytes > req.nbytes:
            # truncated: read (or have streamed, CTS) only the head that fits, straight
            # into the buffer
            eng._truncate(req, src, tag, nbytes)
            if not req.nbytes:           # nothing fits: release the sender unread
                eng._emit(src, _pack((FIN, sid)))
                req._complete()
                return
            nbytes, dest = req.nbytes, req.view
        else:
            dest = eng._dest_for(req, src, tag, nbytes)
        if desc is not None and t.can_read(src):
            if eng._polling:
                eng.outbox.append((READ, src, desc, nbytes, dest, req, sid, tag))
            else:
                self.read(src, desc, nbytes, dest, req, sid, tag)
            return
        rid = self.next_id
        self.next_id += 1
        self.recvs[rid] = req
        req.view = dest
        eng._emit(src, _pack((CTS, sid, rid, nbytes)))

    def read(self, src, desc, nbytes, dest, req, sid, tag) -> None:
        """Copy a large message straight from the sender's buffer; FIN releases it."""
        t = self.engine.route[src]
        try:
            t.read_remote(src, desc, nbytes, dest)
        except RemoteAccessError:
            # the sender withdrew the buffer while we read it (a Send that timed out, a
            # Cancel): the bytes may be the caller's later ones, so fail the receive
            req.error = CommError(
                f"rank {self.engine.rank}: the message of {nbytes} bytes from rank {src} "
                f"(tag {tag}) was withdrawn by its sender while it was being read "
                "(its Send timed out or was cancelled)")
        t.send(src, _pack((FIN, sid)), None, None)
        req._complete()

    def decline(self, peer: int, sid: int) -> None:
        """Release ``peer``'s send ``sid`` unread (FIN): its receive failed, or its call is
        abandoned."""
        self.engine._emit(peer, _pack((FIN, sid)))

    def on_data(self, rid: int) -> Request:
        """DATA: the receive ``rid`` whose buffer (its ``view``) the payload lands in."""
        return self.recvs.pop(rid)

    def on_cancel(self, peer: int, sid: int) -> None:
        """CANCEL: ``peer`` withdrew send ``sid``; drop its RTS if no receive has matched
        it, and answer FIN either way."""
        eng = self.engine
        for i, u in enumerate(eng.unexpected):
            if u.kind == RTS and u.src == peer and u.sid == sid:
                del eng.unexpected[i]
                if u.sig is not None:
                    eng._unqueued(u)
                break
        # answered whether or not it was found (read already, or dropped with an
        # abandoned call): the sender then forgets the message
        eng._emit(peer, _pack((FIN, sid)))

    def on_nak(self, peer: int, rid: int) -> None:
        """NAK: ``peer`` withdrew the message receive ``rid`` answered CTS for: fail it."""
        req = self.recvs.pop(rid)
        req.error = CommError(f"rank {self.engine.rank}: the message of {req.count} bytes "
                              f"from rank {peer} (tag {req.tag}) was withdrawn by its sender "
                              "(its Send timed out or was cancelled)")
        req._complete()

    # -- failures -------------------------------------------------------------------------
    def fail_call(self, ctx: int, tag: int, error: Exception) -> None:
        """Fail the large receives and withdraw the large sends of abandoned collective
        call ``(ctx, tag)`` (see :mod:`pycomm.aborts`)."""
        for rid, r in list(self.recvs.items()):
            if r.ctx == ctx and r.tag == tag and not r.done:
                r.error = error         # its DATA, if it still comes, lands and is ignored
                r._complete()
        for sid, r in list(self.sends.items()):
            if r.ctx == ctx and r.tag == tag:
                self._withdraw(sid, r)
                r.error = error
                r._complete()
