"""Partitioned point-to-point communication (MPI-4.1 chapter 4): ``Comm.Psend_init``,
``Comm.Precv_init`` and ``Prequest.Pready``/``Pready_range``/``Pready_list``/``Parrived``.

How it moves: each partition is its own point-to-point message, sent when the sender
marks it ready. A receive's ``Start`` posts one receive per partition, straight into that
partition's slice of the buffer (a packed scratch for a non-contiguous datatype, unpacked
at completion), so ``Parrived(i)`` is exactly "the receive of partition i is complete".
The sender's ``Start`` posts nothing (MPI-4.1 section 4.2.2: starting enables no transfer);
``Pready(i)`` posts the send of partition i from the buffer's contents at that moment; the
request completes when every partition is marked ready and sent.

Matching: the messages travel on the communicator's own point-to-point context under
negative tags, ``-2 - (tag << 31) - partition``, which no user receive can match (user
tags are 0..TAG_UB and ``ANY_TAG`` matches only those), so partitioned traffic never meets
user messages, and partition i of a round meets partition i of the peer's round in order
(messages between two ranks with one tag keep their order). Requests that share (peer,
tag, communicator) therefore match round by round in the order they are started, where
MPI matches them by the order of their initialization calls (section 4.2.3).

MPICH's behaviours kept (mpi4py 4.1.2 + MPICH 5.0.2, recorded): ``Pready`` on an inactive
request is ERR_REQUEST, a partition out of range ERR_OTHER, a second ``Pready`` of a
partition nothing; ``Parrived`` on an inactive receive is True, on a send ERR_REQUEST;
zero partitions ERR_ARG; a buffer that does not split into the partitions a ValueError
(an ``MPI.Exception`` ERR_COUNT here). Different partitionings on the two sides (MPICH
fails an assertion) end the receive with ERR_COUNT naming the partition. Wildcards are
refused (ERR_RANK, ERR_TAG): a receive per partition cannot match ``ANY_SOURCE``.
"""

from __future__ import annotations

from pycomm.buffers import byte_view
from pycomm.errors import ArgumentError
from pycomm.p2p import ANY_SOURCE, ANY_TAG, PROC_NULL, null_request

from .exceptions import mpi_error
from .joined import Joined
from .msgspec import as_int, message
from .prequest import Prequest

__all__ = ["install", "precv_init", "psend_init"]


def _tag(tag: int, partition: int) -> int:
    """The engine tag of ``partition`` of a partitioned message of user ``tag``."""
    return -2 - (tag << 31) - partition


class _Partitioned:
    """What a partitioned Prequest binds: the buffer split into ``parts`` partitions, the
    peer and tag; called, it starts one round (``Prequest.Start``)."""

    def __init__(self, comm, spec, parts: int, peer: int, tag: int, send: bool, w: str):
        self.comm, self.spec, self.parts, self.send, self.w = comm, spec, parts, send, w
        self.peer, self.tag = peer, tag
        self.msg = message(spec, w, "buf", writable=not send, blocks=parts)
        if self.msg.array.size % parts:
            raise mpi_error(ArgumentError, "ERR_COUNT", f"{w}: buf: {self.msg.array.size}"
                            f" elements do not split into {parts} equal partitions")
        self.n = self.msg.array.size // parts       # wire elements per partition
        self.ready: list[bool] = []

    def _slice(self, array, i: int):
        return array[i * self.n:(i + 1) * self.n]

    def __call__(self):
        """Start a round: ``(inner request, completion action)`` for ``Prequest``."""
        c, engine = self.comm, self.comm._engine
        c._check_alive()
        if self.send:
            self.ready = [False] * self.parts
            joined = Joined(engine, sealed=False)
            joined.missing = f"{self.w}: partitions not marked ready (Pready)"
            return joined, None
        m = self.msg
        if self.peer == PROC_NULL:
            return Joined(engine, [null_request(engine)] * self.parts), None
        src = c._world[self.peer]
        reqs = []
        for i in range(self.parts):
            r = engine.irecv(byte_view(self._slice(m.array, i)), src, c._pctx,
                             _tag(self.tag, i))
            r.comm = c
            reqs.append(r)
        return Joined(engine, reqs), self._received(reqs)

    def _received(self, reqs):
        def finish() -> None:
            nbytes = self.n * self.msg.array.itemsize
            short = [i for i, r in enumerate(reqs) if r.count != nbytes]
            if short:
                raise mpi_error(ArgumentError, "ERR_COUNT", f"{self.w}: partition "
                                f"{short[0]} got {reqs[short[0]].count} bytes, not "
                                f"{nbytes}: the sender partitions the message differently")
            self.msg.finish()
        return finish

    def pready(self, joined: Joined, i: int) -> None:
        """Post the send of partition ``i`` (once; a second mark is nothing)."""
        if self.ready[i]:
            return
        self.ready[i] = True
        c, engine = self.comm, self.comm._engine
        if self.peer == PROC_NULL:
            joined.add(null_request(engine))
        else:
            m = self.msg
            if m._unpack is not None:     # a packed copy: pack the contents now
                m = message(self.spec, self.w, "buf", writable=False, blocks=self.parts)
            r = engine.isend(byte_view(self._slice(m.array, i)), c._world[self.peer],
                             c._pctx, _tag(self.tag, i))
            r.comm = c
            joined.add(r)
        if all(self.ready):
            joined.seal()


def _init(comm, call: str, buf, partitions, peer, tag, send: bool) -> Prequest:
    c = comm._inner(call)
    w = f"rank {c.rank}: {call}"
    parts = as_int(partitions, "partitions", w)
    if parts < 1:
        raise mpi_error(ArgumentError, "ERR_ARG", f"{w}: partitions={parts}; a partitioned "
                        "message has at least one partition")
    what = "dest" if send else "source"
    peer, tag = as_int(peer, what, w), as_int(tag, "tag", w)
    if peer == ANY_SOURCE or tag == ANY_TAG:       # one receive per partition: no wildcard
        code, arg = ("ERR_RANK", f"source={peer}") if peer == ANY_SOURCE else \
            ("ERR_TAG", f"tag={tag}")
        raise mpi_error(ArgumentError, code, f"{w}: {arg} (a wildcard): a partitioned "
                        "receive names its source and tag")
    peer = c._check_rank(peer, what)
    tag = c._check_tag(tag, "tag")
    return Prequest._persistent(_Partitioned(c, buf, parts, peer, tag, send, w))


def psend_init(self, buf, partitions: int, dest: int, tag: int = 0,
               info=None) -> Prequest:
    """A partitioned send (MPI-4.1 section 4.2.2, ``MPI_Psend_init``).

    Args:
        buf: a message spec; ``[buf, count, datatype]`` gives ``count`` items per
            partition, a bare buffer is split into ``partitions`` equal parts.
        partitions: how many partitions (>= 1).
        dest: the receiving rank, or PROC_NULL (nothing moves).
        tag: 0..TAG_UB.
        info: ignored.

    Returns:
        Prequest: inactive; ``Start`` begins a round, ``Pready(i)`` sends partition i,
        ``Wait`` completes once every partition is marked ready and sent.

    Raises:
        MPI.Exception: ERR_ARG (fewer than one partition), ERR_COUNT (the buffer does
            not split into ``partitions`` equal parts), ERR_RANK, ERR_TAG, ERR_BUFFER;
            raised here, before any byte moves.
    """
    return _init(self, "Psend_init", buf, partitions, dest, tag, True)


def precv_init(self, buf, partitions: int, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               info=None) -> Prequest:
    """A partitioned receive (MPI-4.1 section 4.2.2, ``MPI_Precv_init``).

    Args:
        buf: a writable message spec, split as in :func:`psend_init`.
        partitions: how many partitions (>= 1), as the sender's.
        source: the sending rank, or PROC_NULL; not ANY_SOURCE.
        tag: 0..TAG_UB; not ANY_TAG.
        info: ignored.

    Returns:
        Prequest: inactive; ``Start`` posts a receive per partition, ``Parrived(i)``
        tells whether partition i is in ``buf``, ``Wait`` completes the round.

    Raises:
        MPI.Exception: as :func:`psend_init`; ERR_RANK / ERR_TAG for the wildcards
            (mpi4py's defaults), which a partitioned receive cannot match.
    """
    return _init(self, "Precv_init", buf, partitions, source, tag, False)


def _state(req: Prequest, call: str, send: bool) -> _Partitioned:
    st = getattr(req, "_start", None)
    if not isinstance(st, _Partitioned) or st.send != send or req._r is None and send:
        kind = "an active partitioned send" if send else "a partitioned receive"
        raise mpi_error(ArgumentError, "ERR_REQUEST", f"Prequest.{call}: not {kind} "
                        "request")
    return st


def _partition(st: _Partitioned, call: str, i) -> int:
    i = as_int(i, "partition", f"Prequest.{call}")
    if not 0 <= i < st.parts:
        raise mpi_error(ArgumentError, "ERR_OTHER", f"{st.w}: Prequest.{call}: partition "
                        f"{i} is not in 0..{st.parts - 1}")
    return i


def pready(self, partition: int) -> None:
    """Mark ``partition`` of an active partitioned send ready: its bytes are sent now
    (MPI-4.1 section 4.2.3, ``MPI_Pready``).

    Raises:
        MPI.Exception: ERR_REQUEST (not an active partitioned send), ERR_OTHER (a
            partition out of range, as MPICH).
    """
    st = _state(self, "Pready", True)
    st.pready(self._r, _partition(st, "Pready", partition))


def pready_range(self, partition_low: int, partition_high: int) -> None:
    """Mark partitions ``partition_low..partition_high`` (inclusive) ready (MPI-4.1
    section 4.2.3, ``MPI_Pready_range``).

    Raises:
        MPI.Exception: as :func:`pready`, for either bound, before any is marked.
    """
    st = _state(self, "Pready_range", True)
    lo = _partition(st, "Pready_range", partition_low)
    hi = _partition(st, "Pready_range", partition_high)
    for i in range(lo, hi + 1):
        st.pready(self._r, i)


def pready_list(self, partitions) -> None:
    """Mark every partition of the sequence ``partitions`` ready (MPI-4.1 section 4.2.3,
    ``MPI_Pready_list``).

    Raises:
        MPI.Exception: as :func:`pready`, for any item, before any is marked.
    """
    st = _state(self, "Pready_list", True)
    items = [_partition(st, "Pready_list", i) for i in partitions]
    for i in items:
        st.pready(self._r, i)


def parrived(self, partition: int) -> bool:
    """Whether ``partition`` of a partitioned receive has arrived (MPI-4.1 section
    4.2.4, ``MPI_Parrived``); drives progress once when it has not.

    Returns:
        bool: True when the partition is in the buffer, and for an inactive request.

    Raises:
        MPI.Exception: ERR_REQUEST (not a partitioned receive), ERR_OTHER (a partition
            out of range); a failed receive's error (a peer lost...).
    """
    st = _state(self, "Parrived", False)
    i = _partition(st, "Parrived", partition)
    joined = self._r
    if joined is None:
        return True
    part = joined.parts[i]
    if not part.done:
        joined.engine.progress()
    if part.done and part.error is not None:
        raise part.error
    return part.done


def install(ns: dict) -> None:
    """Give ``Comm`` its partitioned initializations and ``Prequest`` its partition
    calls (a plain persistent request refuses them with ERR_REQUEST)."""
    from .exceptions import translating
    comm, preq = ns["Comm"], ns["Prequest"]
    for cls, name, fn in ((comm, "Psend_init", psend_init),
                          (comm, "Precv_init", precv_init), (preq, "Pready", pready),
                          (preq, "Pready_range", pready_range),
                          (preq, "Pready_list", pready_list),
                          (preq, "Parrived", parrived)):
        method = translating(fn)
        method.__name__ = method.__qualname__ = name
        setattr(cls, name, method)
