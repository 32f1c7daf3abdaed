"""Nonblocking collectives: ``Ibarrier``, ``Ibcast``, ``Iallreduce``, … returning Requests.

Design. A nonblocking collective is validated and prepared in the calling thread exactly
like its blocking twin (same checks, same algorithm choice, same per-call sequence number,
so the calling order fixes the matching on every rank), and its schedule, the very same
algorithm function, then runs on the process's *progress thread*. That thread executes
the posted collectives one after the other, in posting order, which MPI requires to be the
same on every rank, so they cannot deadlock each other. Meanwhile the caller computes; the
request completes when the schedule returns, and ``Wait``/``Test``/``Waitall`` work on it
like on any request (mixed with point-to-point requests too).

The engine becomes thread-safe on the first nonblocking call (see
:meth:`pycomm.p2p.Engine.enable_threads`). Overlap is real where the caller's compute
leaves the CPU or releases the GIL (numpy kernels, I/O, an accelerator): the progress
thread's copies (``process_vm_readv``, socket I/O) and reductions (numpy ufuncs) release
the GIL too. On a machine with as many ranks as cores, CPU-bound compute and the copies of
communication still share one core per rank, so only the waiting is overlapped.
"""

from __future__ import annotations

import queue
import threading

import numpy as np

from .buffers import IN_PLACE, as_array
from .errors import CommError
from .ops import SUM
from .p2p import ANY_TAG, PROC_NULL, Request
from .waiting import OFFLOADED

__all__ = ["NonblockingMethods", "shutdown"]

_workers: dict[int, "_ProgressThread"] = {}
_lock = threading.Lock()


class _ProgressThread(threading.Thread):
    """Runs posted collective schedules in order, completing their requests."""

    def __init__(self, engine):
        super().__init__(name="pycomm-progress", daemon=True)
        self.engine = engine
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()

    def run(self) -> None:
        self.engine.offload_ident = threading.get_ident()
        while True:
            item = self.tasks.get()
            if item is None:
                return
            jobs, req = item
            self.engine.offload_running += 1   # only this thread writes it
            try:
                for job in jobs:
                    job()
            except BaseException as exc:       # delivered to whoever waits on the request
                req.error = exc
            finally:
                self.engine.offload_running -= 1
                self.engine.offload_done += 1     # only this thread writes it
            req._complete()
            self.engine.notify()


def _worker_for(engine) -> _ProgressThread:
    with _lock:
        w = _workers.get(id(engine))
        if w is None or not w.is_alive():
            engine.enable_threads()
            w = _ProgressThread(engine)
            w.start()
            _workers[id(engine)] = w
        return w


def shutdown(engine, timeout: float = 5.0) -> None:
    """Stop ``engine``'s progress thread after the collectives already posted."""
    with _lock:
        w = _workers.pop(id(engine), None)
    if w is not None:
        w.tasks.put(None)
        w.join(timeout)


class NonblockingMethods:
    """Mixin: the I-variants of the buffer collectives (mpi4py names).

    Each validates and prepares its call in the calling thread exactly as its blocking
    twin (same checks and errors, same algorithm choice), then queues the schedule for the
    progress thread and returns a Request. The buffers must stay untouched until the
    request completes; its ``Wait``/``Test`` raise what the schedule raised (PeerError,
    CommTimeoutError, CollectiveMismatchError, CollectiveError).
    """

    _defer: list | None = None

    def _nonblocking(self, method, *args, **kwargs) -> Request:
        if self._defer is not None:
            raise CommError("nonblocking collectives cannot be nested")
        worker = _worker_for(self._engine)
        self._defer = []
        try:
            method(*args, **kwargs)       # validates, prepares, queues the schedule
            jobs = self._defer
        finally:
            self._defer = None
        req = Request(self._engine, None, -1, PROC_NULL, ANY_TAG)
        req.expect = OFFLOADED            # completed by the progress thread alone
        self._engine.offload_posted += 1  # only the posting thread writes it
        worker.tasks.put((jobs, req))
        return req

    def Ibarrier(self, **kw) -> Request:
        """Start a barrier (:meth:`Barrier`).

        Args:
            **kw: keyword-only options of :meth:`Barrier` (``algorithm=``).

        Returns:
            A Request; it completes once every rank has entered the barrier.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Barrier`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Barrier, **kw)

    def Ibcast(self, buf, root: int = 0, **kw) -> Request:
        """Start broadcasting ``buf`` from ``root`` (:meth:`Bcast`).

        Args:
            buf: the data at the root, the receive buffer elsewhere (same size and dtype).
            root: rank that sends.
            **kw: keyword-only options of :meth:`Bcast` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Bcast`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Bcast, buf, root, **kw)

    def Ireduce(self, sendbuf, recvbuf, op=SUM, root: int = 0, **kw) -> Request:
        """Start combining every rank's ``sendbuf`` with ``op`` at ``root`` (:meth:`Reduce`).

        Args:
            sendbuf: this rank's contribution, or IN_PLACE (then ``recvbuf`` holds it).
            recvbuf: receives the result at the root (ignored elsewhere).
            op: SUM, PROD, MIN, MAX, ... or a user Op.
            root: rank that gets the result.
            **kw: keyword-only options of :meth:`Reduce` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Reduce`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Reduce, sendbuf, recvbuf, op, root, **kw)

    def Iallreduce(self, sendbuf, recvbuf, op=SUM, **kw) -> Request:
        """Start combining every rank's ``sendbuf`` with ``op`` for all (:meth:`Allreduce`).

        Args:
            sendbuf: this rank's contribution, or IN_PLACE (then ``recvbuf`` holds it).
            recvbuf: receives the result (writable).
            op: SUM, PROD, MIN, MAX, ... or a user Op.
            **kw: keyword-only options of :meth:`Allreduce` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Allreduce`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Allreduce, sendbuf, recvbuf, op, **kw)

    def Iallgather(self, sendbuf, recvbuf, **kw) -> Request:
        """Start gathering every rank's block into every ``recvbuf`` (:meth:`Allgather`).

        Args:
            sendbuf: this rank's block (n elements), or IN_PLACE (already in ``recvbuf``).
            recvbuf: size * n elements (writable).
            **kw: keyword-only options of :meth:`Allgather` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Allgather`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Allgather, sendbuf, recvbuf, **kw)

    def Ialltoall(self, sendbuf, recvbuf, **kw) -> Request:
        """Start an all-to-all: block j of ``sendbuf`` goes to rank j (:meth:`Alltoall`).

        Args:
            sendbuf: size blocks of n elements, or IN_PLACE (``recvbuf`` holds them).
            recvbuf: size blocks of n elements; block j receives rank j's block (writable).
            **kw: keyword-only options of :meth:`Alltoall` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Alltoall`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Alltoall, sendbuf, recvbuf, **kw)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=SUM, **kw) -> Request:
        """Start a reduction whose block i goes to rank i (:meth:`Reduce_scatter_block`).

        Args:
            sendbuf: size blocks of n elements, or IN_PLACE (``recvbuf`` holds them all).
            recvbuf: receives this rank's n reduced elements (writable).
            op: SUM, PROD, MIN, MAX, ... or a user Op.
            **kw: keyword-only options of :meth:`Reduce_scatter_block` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Reduce_scatter_block`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Reduce_scatter_block, sendbuf, recvbuf, op, **kw)

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM, **kw) -> Request:
        """Start a reduction that gives rank i ``recvcounts[i]`` elements (:meth:`Reduce_scatter`).

        With ``recvcounts`` None the ranks first agree on the counts (each ``recvbuf``'s
        size) with a blocking Allgather, as mpi4py's Ireduce_scatter does; the reduction itself
        runs on the progress thread.

        Args:
            sendbuf: ``sum(recvcounts)`` elements, or IN_PLACE (``recvbuf`` holds them).
            recvbuf: receives this rank's ``recvcounts[rank]`` elements (writable).
            recvcounts: elements per rank, or None (see above).
            op: SUM, PROD, MIN, MAX, ... or a user Op.
            **kw: keyword-only options of :meth:`Reduce_scatter` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Reduce_scatter`, before anything
                is posted.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError: the
                blocking Allgather of the counts failed (see
                :class:`~pycomm.comm.Communicator`).
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        if recvcounts is None and sendbuf is not IN_PLACE:
            recv = as_array(recvbuf, self.rank, "recvbuf", writable=True)
            table = np.empty(self.size, dtype=np.int64)
            self.Allgather(np.array([recv.size], dtype=np.int64), table)
            recvcounts = table.tolist()
        return self._nonblocking(self.Reduce_scatter, sendbuf, recvbuf, recvcounts, op, **kw)

    def Igather(self, sendbuf, recvbuf, root: int = 0, **kw) -> Request:
        """Start gathering every rank's ``sendbuf`` into ``recvbuf`` at ``root`` (:meth:`Gather`).

        Args:
            sendbuf: this rank's n elements, or IN_PLACE at the root.
            recvbuf: size * n elements at the root (ignored elsewhere).
            root: rank that receives.
            **kw: keyword-only options of :meth:`Gather` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Gather`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Gather, sendbuf, recvbuf, root, **kw)

    def Iscatter(self, sendbuf, recvbuf, root: int = 0, **kw) -> Request:
        """Start sending block i of root's ``sendbuf`` to rank i (:meth:`Scatter`).

        Args:
            sendbuf: size * n elements at the root (ignored elsewhere).
            recvbuf: this rank's n elements, or IN_PLACE at the root.
            root: rank that sends.
            **kw: keyword-only options of :meth:`Scatter` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Scatter`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Scatter, sendbuf, recvbuf, root, **kw)

    def Igatherv(self, sendbuf, recvbuf, root: int = 0, **kw) -> Request:
        """Start gathering variable-size blocks at ``root`` (:meth:`Gatherv`).

        Args:
            sendbuf: this rank's block, or IN_PLACE at the root.
            recvbuf: at the root, a vector spec ``[buf, counts, displs, ...]``.
            root: rank that receives.
            **kw: keyword-only options of :meth:`Gatherv` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Gatherv`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Gatherv, sendbuf, recvbuf, root, **kw)

    def Iscatterv(self, sendbuf, recvbuf, root: int = 0, **kw) -> Request:
        """Start sending variable-size blocks from ``root`` (:meth:`Scatterv`).

        Args:
            sendbuf: at the root, a vector spec ``[buf, counts, displs, ...]``.
            recvbuf: this rank's block, or IN_PLACE at the root.
            root: rank that sends.
            **kw: keyword-only options of :meth:`Scatterv` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Scatterv`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Scatterv, sendbuf, recvbuf, root, **kw)

    def Iallgatherv(self, sendbuf, recvbuf, **kw) -> Request:
        """Start gathering variable-size blocks on every rank (:meth:`Allgatherv`).

        Args:
            sendbuf: this rank's block, or IN_PLACE (already in ``recvbuf``).
            recvbuf: a vector spec ``[buf, counts, displs, ...]``.
            **kw: keyword-only options of :meth:`Allgatherv` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Allgatherv`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Allgatherv, sendbuf, recvbuf, **kw)

    def Ialltoallv(self, sendbuf, recvbuf, **kw) -> Request:
        """Start a variable-size all-to-all (:meth:`Alltoallv`).

        Args:
            sendbuf: a vector spec whose block j goes to rank j, or IN_PLACE.
            recvbuf: a vector spec whose block j receives rank j's block.
            **kw: keyword-only options of :meth:`Alltoallv` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Alltoallv`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Alltoallv, sendbuf, recvbuf, **kw)

    def Iscan(self, sendbuf, recvbuf, op=SUM, **kw) -> Request:
        """Start an inclusive prefix reduction (:meth:`Scan`).

        Args:
            sendbuf: this rank's contribution, or IN_PLACE (then ``recvbuf`` holds it).
            recvbuf: receives the result (writable).
            op: SUM, PROD, MIN, MAX, ... or a user Op (rank order kept).
            **kw: keyword-only options of :meth:`Scan` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Scan`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Scan, sendbuf, recvbuf, op, **kw)

    def Iexscan(self, sendbuf, recvbuf, op=SUM, **kw) -> Request:
        """Start an exclusive prefix reduction (:meth:`Exscan`).

        Rank 0's ``recvbuf`` is left untouched.

        Args:
            sendbuf: this rank's contribution, or IN_PLACE (then ``recvbuf`` holds it).
            recvbuf: receives the result (writable).
            op: SUM, PROD, MIN, MAX, ... or a user Op (rank order kept).
            **kw: keyword-only options of :meth:`Exscan` (``algorithm=``).

        Returns:
            A Request; it completes when the schedule has run.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Exscan`, before anything
                is posted.
            CommError: the communicator has been freed, or another thread is posting a
                nonblocking collective on it at the same moment.
        """
        return self._nonblocking(self.Exscan, sendbuf, recvbuf, op, **kw)
