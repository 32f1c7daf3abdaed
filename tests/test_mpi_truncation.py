"""pycomm.MPI receives too small for their message, as mpi4py + MPICH report them: the
error class, what the buffer and the status hold afterwards, and what a ``Waitall``
with such a receive raises, eager and rendezvous, through plain buffers and datatypes;
and a ``Waitall`` that times out, which no request failed.

Every ``_rank_*`` function runs on the ranks (``world.run``) and returns what it saw; the
parent compares it with MPICH's recorded behaviour.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np

from pycomm import MPI

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _rank_truncation() -> list:
    comm = MPI.COMM_WORLD
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    req = comm.Isend([np.zeros(4), MPI.DOUBLE], right, 11)
    try:
        comm.Recv([np.zeros(2), MPI.DOUBLE], left, 11)
    except MPI.Exception as exc:
        req.Wait()
        return [exc.Get_error_class(), type(exc).__name__,
                isinstance(exc, __import__("pycomm").TruncationError)]
    return ["no error"]


def test_truncation_is_err_truncate(world):
    assert world.run(_rank_truncation) == [[MPI.ERR_TRUNCATE, "TruncationError", True]] \
        * world.size


HOWS = ("Recv", "Irecv", "Sendrecv", "Recv_init", "Sendrecv_replace")
TYPED_ONLY = ("Recv_init", "Sendrecv_replace")


def _rank_truncated_receives_keep_the_head() -> list:
    """Recv, Irecv and Sendrecv of a message larger than the buffer, eager (10 ints) and
    rendezvous (100,000 ints): each raises ERR_TRUNCATE, and, as under mpi4py 4.1.2 +
    MPICH 5.0.2 (recorded on this machine: ``[0, 1, 2, 3]``, count 4, source and tag of
    the message, for all eight), the buffer holds the message's head and the status its
    source, tag and the elements received. Through a vector datatype (4 blocks of one INT,
    stride 2, in 8 INTs; and a persistent receive and Sendrecv_replace too) the head
    lands in the blocks: ``[0, -1, 1, -1, 2, -1, 3, -1]``, as MPICH left it (recorded)."""
    comm = MPI.COMM_WORLD
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    vec = MPI.INT.Create_vector(4, 1, 2).Commit()
    seen = []
    for n in (10, 100_000):
        for tag, how in enumerate(HOWS, start=20):
            for typed in (False, True):
                if how in TYPED_ONLY and not typed:
                    continue
                out = np.arange(n, dtype="i")
                req = comm.Isend(out, right, tag) if how != "Sendrecv" else None
                back = None
                buf, st = np.full(8 if typed else 4, -1, "i"), MPI.Status()
                spec = [buf, 1, vec] if typed else buf
                try:
                    if how == "Recv":
                        comm.Recv(spec, left, tag, st)
                    elif how == "Irecv":
                        comm.Irecv(spec, left, tag).Wait(st)
                    elif how == "Sendrecv_replace":
                        # its own send (the 4 INTs the spec holds) goes out on tag + 50;
                        # the message it receives is the Isend's, of n INTs
                        back = comm.Irecv(np.empty(8, "i"), left, tag + 50)
                        comm.Sendrecv_replace(spec, right, tag + 50, left, tag, st)
                    elif how == "Recv_init":
                        p = comm.Recv_init(spec, left, tag)
                        p.Start()
                        p.Wait(st)
                        p.Free()
                    else:
                        comm.Sendrecv(out, right, tag, spec, left, tag, st)
                    seen.append((how, n, typed, "no error"))
                except MPI.Exception as exc:
                    seen.append((how, n, typed, exc.Get_error_class() == MPI.ERR_TRUNCATE,
                                 buf.tolist(), st.Get_count(MPI.INT), st.source == left,
                                 st.tag))
                if req is not None:
                    req.Wait()
                if back is not None:
                    back.Wait()
                comm.Barrier()      # (the Sendrecv's own send completes with its receive)
    vec.Free()
    # a large message into an empty buffer: nothing fits, the sender is released unread
    # (MPICH, recorded: ERR_TRUNCATE, count 0, tag 30)
    req = comm.Isend(np.arange(100_000, dtype="i"), right, 30)
    st = MPI.Status()
    try:
        comm.Recv(np.zeros(0, "i"), left, 30, st)
        seen.append(("empty", "no error"))
    except MPI.Exception as exc:
        seen.append(("empty", exc.Get_error_class() == MPI.ERR_TRUNCATE,
                     st.Get_count(MPI.INT), st.tag))
    req.Wait()
    return seen


def test_truncated_receives_keep_the_head_and_fill_the_status(world):
    head = {False: [0, 1, 2, 3], True: [0, -1, 1, -1, 2, -1, 3, -1]}
    want = [(how, n, typed, True, head[typed], 4, True, tag) for n in (10, 100_000)
            for tag, how in enumerate(HOWS, start=20)
            for typed in (False, True) if typed or how not in TYPED_ONLY] + \
        [("empty", True, 0, 30)]
    assert world.run(_rank_truncated_receives_keep_the_head) == [want] * world.size


def _rank_truncated_receive_in_waitall() -> list:
    """``Waitall`` of a receive too small for its message and the matching send, with
    statuses and without, eager and rendezvous. As under mpi4py 4.1.2 + MPICH 5.0.2
    (recorded on this machine): ``MPI.Exception`` of class ``ERR_IN_STATUS``; the
    receive's status has the message's source and tag, the bytes received and, as its
    ``error``, the class ``ERR_TRUNCATE``; the receive is null afterwards; the buffer holds
    the message's head. (MPICH left the send pending, ``ERR_PENDING`` in its status;
    pycomm's is complete, status error 0: the standard allows either.)"""
    comm = MPI.COMM_WORLD
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    seen = []
    for n in (3, 100_000):
        for with_statuses in (True, False):
            small = np.zeros(1)
            rr = comm.Irecv(small, left, 12)
            sr = comm.Isend(np.arange(float(n)) + comm.rank, right, 12)
            sts = [MPI.Status(), MPI.Status()] if with_statuses else None
            try:
                MPI.Request.Waitall([rr, sr], sts)
                seen.append("no error")
            except MPI.Exception as exc:
                st = sts[0] if sts else MPI.Status()
                seen.append((exc.Get_error_class() == MPI.ERR_IN_STATUS,
                             small[0] == left, bool(rr),
                             (st.source, st.tag, st.Get_count(MPI.BYTE),
                              st.Get_error()) if sts else None))
            if sr:
                sr.Wait()
            comm.Barrier()
    return seen


def test_truncated_receive_in_waitall_is_err_in_status(world):
    for rank, seen in enumerate(world.run(_rank_truncated_receive_in_waitall)):
        left = (rank - 1) % world.size
        want = [(True, True, False, (left, 12, 8, MPI.ERR_TRUNCATE)),
                (True, True, False, None)] * 2
        assert seen == want, seen


def _rank_waitall_that_times_out() -> tuple:
    """A ``Waitall`` whose receive never gets a message, beside a small send that is
    complete: the wait's own timeout (``ERR_PENDING``) leaves it, not ``ERR_IN_STATUS``;
    the receive stays live and its status untouched."""
    comm = MPI.COMM_WORLD
    eng = comm._c._engine
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    rr = comm.Irecv(np.zeros(1), left, 77)          # nothing is sent on tag 77
    sr = comm.Isend(np.ones(1), right, 78)
    sts = [MPI.Status(), MPI.Status()]
    sts[0].Set_error(MPI.ERR_OTHER)                 # to see that it is left alone
    old, eng.timeout = eng.timeout, 0.3
    try:
        MPI.Request.Waitall([rr, sr], sts)
        out = ("no error",)
    except MPI.Exception as exc:
        out = (exc.Get_error_class() == MPI.ERR_PENDING, bool(rr),
               sts[0].Get_error() == MPI.ERR_OTHER)
    finally:
        eng.timeout = old
    rr.Cancel()
    rr.Wait()
    comm.Recv(np.zeros(1), left, 78)
    sr.Wait()
    comm.Barrier()
    return out


def test_a_waitall_that_times_out_raises_the_timeout(world):
    assert world.run(_rank_waitall_that_times_out) == [(True, True, True)] * world.size

