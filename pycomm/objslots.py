"""Small object collectives through the shared-memory slots: one exchange of pickles.

mpi4py programs reduce, gather and broadcast small Python objects all the time (a loss,
a count, a dict of settings). By messages each such call is several steps: a broadcast
sends the pickle's size, then the pickle; an all-reduce gathers at rank 0 and broadcasts
the result; an all-gather gathers, then broadcasts the list. On a communicator whose
ranks share one host's slots (:mod:`pycomm.shmcoll`), a call whose pickle fits this
rank's slot is one slot exchange instead: each rank that contributes writes its pickle
into its slot (the header's byte count says how long it is), every rank waits for every
peer's header (and checks its signature, as every slot call does), and each reads what it
needs straight out of the peers' slots: the root's pickle (``bcast``), every pickle at
the root (``gather``) or everywhere (``allgather``; ``allreduce``, which then combines the
objects itself, in rank order, as mpi4py's ``allreduce`` does without its fast-reduce
option: every rank holds the same objects and folds them in the same order).
``scatter`` and ``alltoall`` stay with messages: through the slots the scatter's root
waits for every peer's header where its eager sends return at once, and neither measured
faster (benchmarks/README.md, 2026-11-27).

A rank whose pickle does not fit (or that cannot use the slots) runs the call by
messages; its peers see that in its arrival word and run the message algorithm too, from
the same inputs (:class:`pycomm.shmcoll.ByMessages`). As for the buffer collectives,
naming an algorithm for the collective (``PYCOMM_ALGORITHM_BCAST`` for ``bcast``...)
turns the slots off for it.
"""

from __future__ import annotations

import pickle

import numpy as np

from . import trace as _trace
from .plan import SHARED_SLOTS, slot_limit, slots_of
from .shmcoll import ByMessages

__all__ = ["Pickles", "exchange"]


class Pickles:
    """The pickles of one slot exchange: :meth:`load` unpickles rank ``r``'s, read in
    place from its slot (valid until this rank's next call on the communicator)."""

    __slots__ = ("data", "headers", "p")

    def __init__(self, slots, p: int):
        self.data, self.headers, self.p = slots.data, slots.headers, p

    def load(self, r: int):
        n = int(self.headers[r][self.p][3])
        return pickle.loads(self.data[r][self.p][:n]) if n else None


def exchange(comm, collective: str, sig, data: bytes):
    """Begin object call ``collective`` (``bcast``, ``gather``, ``allgather`` or
    ``allreduce``) with signature ``sig``, contributing the pickle ``data`` (``b""``: this
    rank contributes nothing), and run its exchange through the slots where it can.

    Returns:
        ``(cc, pickles)``: the call's view and, when the exchange went through the slots,
        the :class:`Pickles` to read; ``pickles`` is None when the call must run by
        messages (on ``cc``, already begun: the caller runs its message algorithm).

    Raises:
        CollectiveMismatchError: a peer is in another call.
        PeerError, CommTimeoutError, CollectiveError: as any wait of the engine.
    """
    calls = comm._calls
    slots = slots_of(comm)
    if slots is None or comm._defer is not None or len(data) > slot_limit(slots, collective):
        cc = calls.begin(sig)
        if slots is not None:   # (a peer may wait in the slots: the recorder says why not)
            _trace.instant(f"{collective} (objects)", comm, cc.tag, len(data), -1)
        return cc, None
    cc = calls.begin(sig, fast=True)
    n, me = len(data), slots.rank
    # the flight recorder's entry, as a buffer call through the slots has one
    t = _trace.begin(f"{collective} (objects)", comm, cc.tag, n, SHARED_SLOTS, -1)
    try:
        p = slots.exchange(cc, n, [slots.data[me][q][:n] for q in (0, 1)],
                           np.frombuffer(data, np.uint8) if n else None)
    except ByMessages:                  # (recorded as run by messages: SharedSlots)
        _trace.end(t)
        # A peer past this call without its header either runs it by messages, or failed
        # before it began it (a pickling error): then its ABORT of this call, sent before
        # it went on, is in its ring. Take it in: the message algorithm of some object
        # calls is made of new calls, which would not hear of this one's abort.
        if slots.shm.has_input():
            comm._engine.progress()
        err = comm._engine.aborted_error(cc.ctx, cc.tag)
        if err is not None:
            raise err from None
        return cc, None
    except BaseException as exc:
        _trace.fail(t, exc)
        raise
    _trace.end(t)
    return cc, Pickles(slots, p)
