"""The collective calls of one communicator: numbered, signed, and kept in step across ranks.

Each :class:`pycomm.comm.Communicator` holds one :class:`CollectiveCalls` (its ``_calls``).
Every collective call, buffer or object, blocking or the preparation of a nonblocking
one, begins with :meth:`CollectiveCalls.begin`, which numbers it (the sequence number is
the tag of every message of the call, on the communicator's collective context) and
returns the :class:`CallView` its algorithm sends and receives through.

Consistency (issue 15): every message carries its call's signature
(:mod:`pycomm.signature`) and a receive checks it. A call that fails on one rank, even
before sending anything, is abandoned on every rank (:meth:`CollectiveCalls.abandon`,
:meth:`pycomm.p2p.Engine.abort_call`), so the next call matches again. A message of a call
this rank has finished proves a mismatch the receives could not see
(:meth:`CollectiveCalls.check_stale`); an abort of a call this rank had already finished
is reported by the next call that completes (:meth:`CollectiveCalls.check_late_abort`).
The decorator :func:`pycomm.signature.collective` drives these around every call.
"""

from __future__ import annotations

import os
import time

import numpy as np

from transports import TransportError

from . import trace as _trace
from .buffers import byte_view
from .errors import (CollectiveError, CollectiveMismatchError, CommError, CommTimeoutError,
                     PeerError, TruncationError)
from .p2p import Request
from .plan import UNDECIDED
from .signature import describe
from .wire import EAGER, _pack

__all__ = ["CallView", "CollectiveCalls"]

_SEQ_MASK = 0x7FFFFFFF  # sequence numbers wrap at 2**31
_REASON_WAIT_S = 1.0    # how long a failed step waits for the abort that explains it
_PAST = 1 << 30         # a tag this far behind the current call or less is in the past


def _raised_at(exc: BaseException) -> str:
    """Where an exception that is not pycomm's own was raised (``" at file:line in
    function"``), for the peers' error: its traceback stays on the rank that raised it,
    and a bug or a user op's error reported only by its message is hard to find."""
    tb = exc.__traceback__
    if isinstance(exc, CommError) or tb is None:
        return ""
    while tb.tb_next is not None:   # (by hand: extract_tb obeys sys.tracebacklimit)
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return f" at {os.path.basename(code.co_filename)}:{tb.tb_lineno} in {code.co_name}"


class CallView:
    """The point-to-point view one collective call gives its algorithm (the ``cc`` argument
    of every function in :mod:`pycomm.collectives`): sends and receives on the call's
    context, tag (its sequence number) and signature, and a ``waitall`` that turns a
    failed step into the error that explains it."""

    __slots__ = ("engine", "ctx", "tag", "rank", "size", "world", "sig", "comm")

    def __init__(self, comm, tag: int, sig):
        self.engine, self.ctx, self.tag = comm._engine, comm._cctx, tag
        self.rank, self.size, self.world = comm.rank, comm.size, comm._world
        self.sig, self.comm = sig, comm

    def isend(self, buf: np.ndarray, dest: int) -> Request:
        return self.engine.isend(byte_view(buf), self.world[dest], self.ctx, self.tag,
                                 self.sig)

    def irecv(self, buf: np.ndarray, source: int) -> Request:
        r = self.engine.irecv(byte_view(buf), self.world[source], self.ctx, self.tag,
                              self.sig)
        r.expect = buf.nbytes         # exact size, checked in waitall
        return r

    def isend_bytes(self, data: bytes, dest: int) -> Request:
        """Send ``data`` (pickled objects) on this call's context, tag and signature."""
        return self.engine.isend(memoryview(data), self.world[dest], self.ctx, self.tag,
                                 self.sig)

    def irecv_bytes(self, source: int) -> Request:
        """Receive a message of any size from ``source`` (``req.obj``: a bytearray)."""
        return self.engine.irecv(None, self.world[source], self.ctx, self.tag, self.sig)

    def waitall(self, reqs) -> None:
        try:
            self.engine.wait_all(reqs)
        except CollectiveMismatchError as exc:
            peer = getattr(exc, "peer", None)
            if peer is None:
                raise
            comm = self.comm
            raise CollectiveMismatchError(
                f"rank {self.rank}: collective mismatch in call #{self.tag} on "
                f"{comm.name}: rank {comm._from_world.get(peer, peer)} is in "
                f"{describe(exc.theirs)}, rank {self.rank} in {describe(exc.mine)}"
            ) from None
        except (CollectiveError, PeerError):
            raise
        except CommError as exc:
            # a withdrawn message or a truncation may be the echo of a peer abandoning
            # the call: its reason, already on the way (perhaps from a third rank, over
            # another link that keeps no order with this one), says more
            eng = self.engine
            deadline = time.monotonic() + (
                0.0 if isinstance(exc, CommTimeoutError) else _REASON_WAIT_S)
            while True:
                try:
                    eng.progress()
                except CommError:
                    pass
                err = eng.aborted_error(self.ctx, self.tag)
                if err is not None:
                    raise err from None
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.0005)
        for r in reqs:
            if r.expect >= 0 and r.count != r.expect:
                raise TruncationError(
                    f"rank {self.rank}: collective received {r.count} bytes from rank "
                    f"{r.source} where {r.expect} were expected: ranks passed inconsistent "
                    "counts, dtypes or roots")

    def send(self, buf: np.ndarray, dest: int) -> None:
        self.engine.wait(self.isend(buf, dest))

    def recv(self, buf: np.ndarray, source: int) -> None:
        self.waitall([self.irecv(buf, source)])

    def sendrecv(self, sendbuf, dest, recvbuf, source) -> None:
        # the exchange of every small recursive-doubling step
        eng, world, ctx, tag, sig = self.engine, self.world, self.ctx, self.tag, self.sig
        sv, rv, wd, ws = byte_view(sendbuf), byte_view(recvbuf), world[dest], world[source]
        t = eng.direct[wd]
        if t is not None and eng.direct[ws] is t and sig is not None and \
                len(sv) <= eng.eager_limit and not eng._threaded and \
                not (eng.aborted and (ctx, tag) in eng.aborted):
            # Without requests where the transport takes the message at once, as
            # Communicator.Sendrecv does (benchmarks/README.md, "Sendrecv without
            # requests"): the send is then done; the receive takes the peer's frame
            # straight from the transport when it is the next one there and carries this
            # very call's header, signature included (any other frame, a mismatched call's
            # or an abort, is left for the general path, whose checks report it).
            hdr = _pack((EAGER, ctx, tag, sig[0], sig[1]))
            try:
                sent = t.send_now(wd, hdr, sv)
                n = -1
                if sent and not (eng.posted or eng.unexpected or eng._incoming or eng.outbox):
                    n = t.recv_now(ws, hdr, rv, eng.spin_s, True)
            except TransportError as exc:
                raise eng._peer_error(exc) from None
            if sent:
                eng.sent_bytes += len(sv)
                eng.sent_messages += 1
                if n == len(rv):
                    return
                if n >= 0:
                    raise TruncationError(
                        f"rank {self.rank}: collective received {n} bytes from rank "
                        f"{source} where {len(rv)} were expected: ranks passed inconsistent "
                        "counts, dtypes or roots")
                r = eng.irecv(rv, ws, ctx, tag, sig)
                r.expect = recvbuf.nbytes
                self.waitall([r])
                return
        r = eng.irecv(rv, ws, ctx, tag, sig)
        r.expect = recvbuf.nbytes         # exact size, checked in waitall
        self.waitall([eng.isend(sv, wd, ctx, tag, sig), r])


class CollectiveCalls:
    """The numbering and failure bookkeeping of one communicator's collective calls.

    Attributes:
        seq: the sequence number of the current (last begun) call.
        sig, prev_sig: the signatures of the current and the previous call.
        aborts_seen: the engine's ``abort_count`` when this communicator last looked.
        failed_upto: the last call that raised on this rank (its seq; -1: none).

    Args:
        comm: the :class:`pycomm.comm.Communicator` whose calls these are.
    """

    __slots__ = ("comm", "seq", "sig", "prev_sig", "aborts_seen", "failed_upto",
                 "_fast_view")

    def __init__(self, comm):
        self.comm = comm
        self.seq = 0
        self.sig = self.prev_sig = None
        self.aborts_seen = 0
        self.failed_upto = -1
        self._fast_view: CallView | None = None    # the view every fast call reuses

    def begin(self, sig, fast: bool = False) -> CallView:
        """Count a collective call and give its algorithm the call's view (``sig``: its
        signature, :func:`pycomm.signature.signature`; ``fast``: it runs through the
        shared-memory slots of :mod:`pycomm.shmcoll` or by direct reads, which hear of
        every call).

        A fast call is blocking and nothing keeps its view once it returns (its message
        fallback runs within it too), so every fast call of the communicator gets the
        same view, renumbered, instead of a new one: building an object is a sizeable
        part of a small call's cost.

        A call a peer has abandoned already fails at its first send or receive (or, if it
        has none here, when it returns: see :func:`pycomm.signature.collective`), after
        this rank's own checks of its arguments, so that its own error comes first.

        Raises:
            CollectiveMismatchError: a message of a finished call was left over.
        """
        comm = self.comm
        if comm._freed:
            raise CommError(f"rank {comm.rank}: {comm.name} has been freed")
        seq = self.seq = (self.seq + 1) & _SEQ_MASK
        self.prev_sig, self.sig = self.sig, sig
        slots = comm._slots
        if slots is not None and slots is not UNDECIDED:
            slots.enter(seq, not fast)
        eng = comm._engine
        eng.current[comm._cctx] = (seq, sig, comm._world)   # arrivals are checked on it
        if eng.coll_tags:
            self._check_early(seq, sig)
        if not fast:
            return CallView(comm, seq, sig)
        view = self._fast_view
        if view is None:
            view = self._fast_view = CallView(comm, seq, sig)
        else:
            view.tag, view.sig = seq, sig
        return view

    def _check_early(self, seq: int, sig) -> None:
        """The start of call ``seq`` while messages of collective calls wait unmatched:
        one of this call that came early under another signature is a mismatch
        (:meth:`pycomm.p2p.Engine.foreign_message`), as is one of a call already finished
        (:meth:`check_stale`)."""
        comm = self.comm
        eng, ctx = comm._engine, comm._cctx
        early = eng.coll_tags.get((ctx, seq))  # messages of this call that came early
        if early is not None and early[1] != sig:
            for u in eng.unexpected:
                if u.ctx == ctx and u.tag == seq and u.sig != sig and u.sig is not None and \
                        eng.foreign_message(ctx, seq, u.sig, u.src, u.nbytes):
                    break
        if eng.offload_posted == eng.offload_done:
            self.check_stale(at_start=True)

    def fast_runner(self, sig, collective: str, nbytes: int, path: str, kernel):
        """The function ``run(*args)`` that makes one blocking call of a plan through
        shared-memory slots or direct reads (``kernel(view, *args)``, see
        :func:`pycomm.plan.plan_call`): what :meth:`begin` does for such a call and the
        flight recorder's entry (:mod:`pycomm.trace`, the call recorded as ``collective``
        of ``nbytes`` by ``path``, as ``trace.begin`` and ``trace.end`` would record it)
        around the kernel, in one frame. Made once per plan: a small call's bookkeeping
        costs as much as its work, and each Python call it makes a few percent of it.

        Raises (from ``run``):
            CommError: the communicator has been freed.
            CollectiveMismatchError: as :meth:`begin`; what the kernel raises.
        """
        comm = self.comm
        eng, cctx, world, slots = comm._engine, comm._cctx, comm._world, comm._slots
        mine = slots.arrival[slots.rank]    # SharedSlots.enter of a call by the slots
        current = eng.current
        if self._fast_view is None:
            self._fast_view = CallView(comm, self.seq, sig)
        view = self._fast_view
        ring, ends, counter, cap, now, keeping = _trace.ring()

        def run(*args):
            if comm._freed:
                raise CommError(f"rank {comm.rank}: {comm.name} has been freed")
            seq = self.seq = (self.seq + 1) & _SEQ_MASK
            self.prev_sig, self.sig = self.sig, sig
            mine[0] = seq << 2 | 2
            current[cctx] = (seq, sig, world)
            if eng.coll_tags:
                self._check_early(seq, sig)
            view.tag, view.sig = seq, sig
            n = next(counter)       # trace.begin, written out
            i = n % cap
            if keeping[0] is not None and ring[i] is not None:
                keeping[0](i)
            ring[i] = (collective, comm, seq, nbytes, path, -1, now(), n)
            try:
                kernel(view, *args)
            except BaseException as exc:
                _trace.fail(n, exc)
                raise
            if ring[i][7] == n:     # trace.end
                ends[i] = now()
        return run

    def check_late_abort(self, name: str) -> None:
        """Raise if a peer abandoned a call that this rank had already finished.

        A rank whose part of a call needs nothing from the others (the root of a Bcast,
        for one) can finish it before a peer finds the call mismatched; the ABORT then
        arrives for a call in this rank's past, at the latest before any later message
        from that peer (a link keeps order). The call ``name`` that just completed here
        (on every rank: nothing is abandoned, its results are right) raises, so that
        this rank learns as the others did, and the ranks stay in step.
        """
        comm = self.comm
        eng = comm._engine
        self.aborts_seen = eng.abort_count
        ctx, seq, noticed = comm._cctx, self.seq, self.failed_upto
        for (c, tag), err in list(eng.aborted.items()):
            if c != ctx or not 0 < (seq - tag) & _SEQ_MASK <= _PAST:
                continue
            if noticed >= 0 and (noticed - tag) & _SEQ_MASK < _PAST:
                continue                # this rank raised in that call or a later one
            self.failed_upto = seq
            late = type(err)(
                f"rank {comm.rank}: {name} #{seq} on {comm.name} completed (its results "
                f"are right), but call #{tag}, which had finished on this rank, was "
                f"abandoned by another rank: {err}")
            late.late = True            # nothing to abandon (see _abandon)
            raise late

    def abandon(self, name: str, seq: int, exc: Exception) -> None:
        """Abandon this rank's call ``name`` #``seq`` after ``exc``, on every rank."""
        comm = self.comm
        eng = comm._engine
        self.failed_upto = seq         # earlier abandoned calls need no more telling
        if isinstance(exc, PeerError) or eng.aborted_error(comm._cctx, seq) is not None \
                or getattr(exc, "late", False):
            # a peer, or a nested call, has abandoned it; or a peer died, which every
            # survivor's liveness check finds by itself (and names, as a PeerError); or
            # the call completed everywhere and only reports an earlier abandoned one
            return
        mismatch = isinstance(exc, CollectiveMismatchError)
        what = str(exc)
        if not what.startswith(f"rank {comm.rank}:"):
            what = f"rank {comm.rank}: {what}"
        text = (f"{name} #{seq} on {comm.name} failed on rank {comm.rank} "
                f"({type(exc).__name__}: {what}{_raised_at(exc)})")
        note = None
        if mismatch:
            # a rank whose part of the mismatched call needed nothing from the others may
            # have finished it already: the next call fails everywhere, so it learns too
            nxt = (seq + 1) & _SEQ_MASK
            note = f"call #{nxt} on {comm.name} is abandoned after an earlier mismatch: {text}"
        eng.abort_call(comm._cctx, seq, comm._world, mismatch, text, note)

    def check_stale(self, at_start: bool) -> None:
        """Raise if a message of a call this rank has finished is waiting unmatched.

        Such a message proves that a peer ran that call differently (see the module
        docstring); the call and the next one are abandoned on every rank.
        """
        comm = self.comm
        eng, ctx, seq = comm._engine, comm._cctx, self.seq
        finished = (seq - 1) & _SEQ_MASK if at_start else seq
        # Only the call just finished: a message of an older one either was here when
        # that call ended (found then) or arrived later (Engine.foreign_message found it)
        if (ctx, finished) not in eng.coll_tags:
            return
        for u in eng.unexpected:
            if u.ctx != ctx or u.tag != finished or (ctx, u.tag) in eng.aborted:
                continue
            mine = self.sig if u.tag == seq else \
                self.prev_sig if u.tag == (seq - 1) & _SEQ_MASK else None
            text = (f"collective mismatch in call #{u.tag} on {comm.name}: rank "
                    f"{comm._from_world.get(u.src, u.src)} sent a message of "
                    f"{describe(u.sig)}, which rank {comm.rank} ran as "
                    f"{describe(mine) if mine else 'another call'} and has finished")
            err = CollectiveMismatchError(f"rank {comm.rank}: {text}")
            nxt = (u.tag + 1) & _SEQ_MASK      # (this rank's current call if at_start)
            eng.abort_call(ctx, u.tag, comm._world, True, text,
                           f"call #{nxt} on {comm.name} is abandoned after an earlier {text}")
            raise err
