"""Abandoned collective calls: the p2p engine's side of failing one call on every rank.

A rank that fails inside a collective call, or rejects its arguments before sending,
abandons the call (:meth:`CallAborts.abort_call`, which
:meth:`pycomm.calls.CollectiveCalls.abandon` calls) and tells every other rank of the
communicator with an ABORT frame (:mod:`pycomm.wire`). Each fails that call's pending
requests with :class:`~pycomm.errors.CollectiveError` (withdrawing its large sends:
:mod:`pycomm.rendezvous`), drops the call's messages that arrive later, and fails every
later send or receive of the call at once, so a rank that has not entered it yet fails at
its first step (:meth:`CallAborts.aborted_error` tells the communicator of a call with no
step on this rank). Every rank counts the call (``abort_count``), so the next one matches.

A collective message that no receive matches can prove a mismatch the receives cannot see
(:meth:`CallAborts.foreign_message`): one of this rank's current call with another
signature, or one of a call this rank has finished. The calls concerned are then
abandoned on every rank likewise, with a :class:`~pycomm.errors.CollectiveMismatchError`.
A receive that matches a message of another signature fails alone
(:meth:`CallAborts._mismatch`): the payload is discarded, so a mismatched call never
writes another call's bytes into a buffer. The bookkeeping of the communicator's calls,
which decides what to abandon and raises, is :mod:`pycomm.calls`.
"""

from __future__ import annotations

from .errors import CollectiveError, CollectiveMismatchError
from .request import Request
from .signature import describe, empty_match
from .wire import ABORT, EAGER, _pack

__all__ = ["CallAborts"]

_SEQ_MASK = 0x7FFFFFFF          # collective sequence numbers wrap at 2**31 (pycomm.calls)
_ABORTED_KEEP = 1024            # abandoned calls remembered (to drop their late messages)
# characters of an ABORT's texts sent to the peers: the frame's header holds at most
# transports.frames.MAX_HEADER (64 KiB) bytes, and an error's message, which the text
# quotes, has no bound (4 bytes a character at most in UTF-8: two texts stay under 40 KiB)
_TEXT_SENT = 4000


def _bounded(text: str) -> str:
    """``text`` cut to :data:`_TEXT_SENT` characters, saying so where it is cut."""
    if len(text) <= _TEXT_SENT:
        return text
    return f"{text[:_TEXT_SENT]}... (cut; {len(text)} characters in all)"


class CallAborts:
    """The half of :class:`pycomm.p2p.Engine` that abandons collective calls.

    Its state is the engine's, for it is read on every send and receive and by
    :mod:`pycomm.calls`, :mod:`pycomm.signature` and :mod:`pycomm.shmcoll`: ``aborted``
    ((ctx, tag) -> the error of an abandoned call, the latest ``_ABORTED_KEEP`` of them)
    and ``abort_count`` (calls abandoned so far). It also reads the engine's ``posted``,
    ``unexpected``, ``current``, ``unordered``, ``offload_posted``/``offload_done`` and
    ``lock``, and fails large messages through its ``rndv``.
    """

    def abort_call(self, ctx: int, tag: int, peers, mismatch: bool, text: str,
                   next_text: str | None = None) -> None:
        """Abandon collective call ``(ctx, tag)`` here and tell ``peers`` (world ranks).

        Fails this rank's pending requests of the call with a
        :class:`~pycomm.errors.CollectiveError` (a :class:`CollectiveMismatchError` if
        ``mismatch``) of ``text`` (which names this rank, the call and why), remembers the
        call as abandoned, and sends every peer an ABORT frame carrying ``text``. With
        ``next_text`` (a mismatch: a rank whose part needed nothing from the others may
        already be in the next call) the call after it is abandoned too, with that text,
        by the same frame: a peer then learns of both at once, and cannot enter the next
        call knowing of the first only (it would find the mismatch there afresh and
        abandon the call after that as well). Peers that are gone are skipped. Idempotent.
        """
        nxt = (ctx, (tag + 1) & _SEQ_MASK)
        if (ctx, tag) in self.aborted and (next_text is None or nxt in self.aborted):
            return
        if self.lock is not None:       # the progress thread may abandon a call too
            with self.lock:
                return self._abort_call(ctx, tag, peers, mismatch, text, next_text)
        return self._abort_call(ctx, tag, peers, mismatch, text, next_text)

    def _abort_call(self, ctx, tag, peers, mismatch, text, next_text) -> None:
        # tell the peers first: a peer whose read of a withdrawn send fails (below) then
        # finds the reason already in its queue
        frame = _pack((ABORT, ctx, tag, mismatch, _bounded(text),
                       None if next_text is None else _bounded(next_text)))
        for p in peers:
            if p != self.rank:          # (a dead peer learns nothing more from us)
                self._emit(p, frame, quiet=True)
        self._abandon_here(ctx, tag, mismatch, f"rank {self.rank}: {text}", next_text)

    def _abandon_here(self, ctx: int, tag: int, mismatch: bool, message: str,
                      next_text: str | None) -> None:
        """Fail call ``(ctx, tag)`` (and, with ``next_text``, the next one) on this rank
        with an error of ``message``; calls already abandoned keep their first error."""
        cls = CollectiveMismatchError if mismatch else CollectiveError
        calls = [(tag, message)]
        if next_text is not None:
            calls.append(((tag + 1) & _SEQ_MASK, f"rank {self.rank}: {next_text}"))
        for t, msg in calls:
            if (ctx, t) not in self.aborted:
                self._fail_call(ctx, t, cls(msg))

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
        self.rndv.fail_call(ctx, tag, error)    # its large messages in flight

    def _on_abort(self, peer: int, h: list) -> None:
        """An ABORT frame (header ``h``) from world rank ``peer``: abandon its call (and
        the next one, if the frame says so) here."""
        _, ctx, tag, mismatch, text, next_text = h
        self._abandon_here(ctx, tag, mismatch, f"rank {self.rank}: {text}", next_text)

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
        elif 0 < (seq - tag) & _SEQ_MASK < 1 << 30 and ctx not in self.unordered and \
                self.offload_posted == self.offload_done and (ctx, tag) not in self.aborted:
            text = (f"collective mismatch in call #{tag}: world rank {peer} sent a message "
                    f"of {describe(sig)} for a call world rank {self.rank} has finished "
                    f"(it is in call #{seq}, {describe(mine)})")
        else:
            return False
        # the message's call, the next one (as CollectiveCalls.abandon does for a mismatch:
        # a rank that needed nothing from the others may be in it), and this rank's own
        nxt = (tag + 1) & _SEQ_MASK
        self.abort_call(ctx, tag, world, True, text, f"call #{nxt} is abandoned after a {text}")
        if seq not in (tag, nxt):
            note = f"call #{seq} is abandoned after a {text}"
            self.abort_call(ctx, seq, world, True, note)
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
