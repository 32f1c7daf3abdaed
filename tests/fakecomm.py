"""A thread-based fake of the collective context ``cc`` that algorithms are written against.

``run_fake(size, fn)`` runs ``fn(cc)`` on ``size`` threads, one :class:`FakeCC` each, and
returns their results in rank order. The fake is stricter than the real p2p engine so that
a broken schedule fails here, with a message, instead of hanging or corrupting data later:

* Matching follows MPI: per (sender, receiver) pair, sends match receives in posting order.
* ``synchronous=True`` (the default) makes every send complete only once the receiver has
  matched it (the rendezvous protocol's worst case): a schedule that relies on buffering,
  e.g. both partners calling blocking ``send`` first, times out instead of passing.
* A receive whose buffer size differs from the message, or a buffer that is not 1-D,
  C-contiguous (receives: writable), raises.
* Sending to oneself raises (no algorithm needs it), and so does an out-of-range peer.
* A send buffer modified before its send completed raises (checked against a snapshot).
* A receive buffer that overlaps the buffer of a still-pending request raises.
* Every wait is bounded (``timeout``); when one rank fails the others are woken at once.
* At the end, unmatched messages, unmatched receives and never-waited requests raise.

Each FakeCC also counts messages and bytes sent (``cc.sent_messages``, ``cc.sent_bytes``)
so tests can check the documented wire costs.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from typing import Any, Callable

import numpy as np

from pycomm.errors import add_note

__all__ = ["each_case", "on_fake_hosts", "FakeCommError", "FakeCC", "run_fake"]


class FakeCommError(AssertionError):
    """An algorithm broke the ``cc`` contract (or hung) under the fake."""


class _AbortedError(Exception):
    """Another rank failed; this one stops waiting."""


class _Request:
    def __init__(self, kind: str, owner: int, peer: int, buf: np.ndarray):
        self.kind, self.owner, self.peer, self.buf = kind, owner, peer, buf
        self.done = False
        self.error: str | None = None
        self.snapshot: bytes | None = None  # sends: the bytes at posting time
        self.matched = False


class _World:
    def __init__(self, size: int, timeout: float, synchronous: bool):
        self.size, self.timeout, self.synchronous = size, timeout, synchronous
        lock = threading.RLock()
        self.cv = threading.Condition(lock)
        # one condition per rank on the world's lock: a match wakes its two ranks only,
        # not every waiting thread (thread wake-ups dominate these tests' time)
        self.rank_cv = [threading.Condition(lock) for _ in range(size)]
        self.sends: dict[tuple[int, int], collections.deque] = collections.defaultdict(
            collections.deque)
        self.recvs: dict[tuple[int, int], collections.deque] = collections.defaultdict(
            collections.deque)
        self.pending: list[set] = [set() for _ in range(size)]  # requests not yet waited
        self.failed = False

    def match(self, src: int, dst: int) -> None:
        """Pair posted sends with posted receives of one (src, dst) pair; holds cv."""
        sends, recvs = self.sends[(src, dst)], self.recvs[(src, dst)]
        while sends and recvs:
            s, r = sends.popleft(), recvs.popleft()
            if s.buf.tobytes() != s.snapshot:
                r.error = s.error = (f"rank {src} modified its send buffer to rank {dst} "
                                     "before the send completed")
            elif len(s.snapshot) != r.buf.nbytes:
                r.error = s.error = (
                    f"rank {dst} posted a {r.buf.nbytes}-byte receive from rank {src} but the "
                    f"message has {len(s.snapshot)} bytes (recv dtype {r.buf.dtype}, size "
                    f"{r.buf.size}; send dtype {s.buf.dtype}, size {s.buf.size})")
            else:
                r.buf.view(np.uint8)[:] = np.frombuffer(s.snapshot, dtype=np.uint8)
            s.matched = r.matched = True
            r.done = True
            s.done = True
        self.rank_cv[src].notify_all()
        self.rank_cv[dst].notify_all()

    def fail(self) -> None:
        """Mark the world failed and wake every waiting rank; holds cv."""
        self.failed = True
        for cv in self.rank_cv:
            cv.notify_all()


class FakeCC:
    """One rank's collective context: the contract in ``pycomm.collectives``."""

    def __init__(self, world: _World, rank: int):
        self._world = world
        self.rank = rank
        self.size = world.size
        self.sent_messages = 0
        self.sent_bytes = 0

    # -- checks -------------------------------------------------------------------------
    def _check(self, buf: Any, peer: int, what: str, writable: bool) -> None:
        if not isinstance(buf, np.ndarray):
            raise FakeCommError(f"rank {self.rank}: {what} buffer is {type(buf).__name__}, "
                                "not a numpy array")
        if buf.ndim != 1 or not buf.flags.c_contiguous:
            raise FakeCommError(f"rank {self.rank}: {what} buffer must be 1-D C-contiguous "
                                f"(shape {buf.shape}, strides {buf.strides})")
        if writable and not buf.flags.writeable:
            raise FakeCommError(f"rank {self.rank}: {what} buffer is read-only")
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.size:
            raise FakeCommError(f"rank {self.rank}: {what} peer {peer!r} out of range "
                                f"0..{self.size - 1}")
        if peer == self.rank:
            raise FakeCommError(f"rank {self.rank}: {what} to/from itself")

    # -- nonblocking --------------------------------------------------------------------
    def isend(self, buf: np.ndarray, dest: int) -> _Request:
        """Post a send of ``buf`` to ``dest``; returns a request for :meth:`waitall`."""
        self._check(buf, dest, "send", writable=False)
        w = self._world
        req = _Request("send", self.rank, int(dest), buf)
        req.snapshot = buf.tobytes()
        with w.cv:
            for other in w.pending[self.rank]:
                if other.kind == "recv" and np.shares_memory(other.buf, buf):
                    raise FakeCommError(f"rank {self.rank}: send buffer to rank {dest} "
                                        f"overlaps a pending receive from rank {other.peer}")
            self.sent_messages += 1
            self.sent_bytes += buf.nbytes
            w.pending[self.rank].add(req)
            w.sends[(self.rank, req.peer)].append(req)
            if not w.synchronous:
                req.done = True
            w.match(self.rank, req.peer)
        return req

    def irecv(self, buf: np.ndarray, source: int) -> _Request:
        """Post a receive into ``buf`` from ``source``; returns a request."""
        self._check(buf, source, "recv", writable=True)
        w = self._world
        req = _Request("recv", self.rank, int(source), buf)
        with w.cv:
            for other in w.pending[self.rank]:
                if np.shares_memory(other.buf, buf):
                    raise FakeCommError(f"rank {self.rank}: receive buffer from rank "
                                        f"{source} overlaps a pending {other.kind} with "
                                        f"rank {other.peer}")
            w.pending[self.rank].add(req)
            w.recvs[(req.peer, self.rank)].append(req)
            w.match(req.peer, self.rank)
        return req

    def waitall(self, reqs: list) -> None:
        """Wait until every request in ``reqs`` completed (bounded by the timeout)."""
        w = self._world
        deadline = time.monotonic() + w.timeout
        with w.cv:
            for req in reqs:
                if req.owner != self.rank:
                    raise FakeCommError(f"rank {self.rank} waited on rank {req.owner}'s request")
                while not req.done:
                    if w.failed:
                        raise _AbortedError()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise FakeCommError(
                            f"rank {self.rank} timed out after {w.timeout}s waiting for a "
                            f"{req.kind} {'to' if req.kind == 'send' else 'from'} rank "
                            f"{req.peer} (deadlock or unmatched message)")
                    w.rank_cv[self.rank].wait(left)
                w.pending[self.rank].discard(req)
                if req.kind == "send" and req.error is None and req.buf.tobytes() != req.snapshot:
                    req.error = (f"rank {self.rank} modified its send buffer to rank "
                                 f"{req.peer} before waiting for the send")
                if req.error is not None:
                    raise FakeCommError(req.error)

    # -- blocking -----------------------------------------------------------------------
    def send(self, buf: np.ndarray, dest: int) -> None:
        """Blocking send."""
        self.waitall([self.isend(buf, dest)])

    def recv(self, buf: np.ndarray, source: int) -> None:
        """Blocking receive; ``buf.nbytes`` must equal the message's."""
        self.waitall([self.irecv(buf, source)])

    def sendrecv(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int) -> None:
        """Send and receive together (deadlock-free)."""
        rreq = self.irecv(recvbuf, source)
        sreq = self.isend(sendbuf, dest)
        self.waitall([rreq, sreq])


class _RankThread:
    """A daemon thread that runs one fake rank after another: starting and joining a
    thread per rank cost more than most of the algorithms these tests run."""

    _idle: list[_RankThread] = []
    _lock = threading.Lock()

    def __init__(self) -> None:
        self._go = threading.Semaphore(0)
        self._job: tuple[Callable[[], None], Callable[[], None]] | None = None
        threading.Thread(target=self._loop, daemon=True, name="fake-rank").start()

    @classmethod
    def take(cls) -> _RankThread:
        with cls._lock:
            return cls._idle.pop() if cls._idle else cls()

    def run(self, job: Callable[[], None], done: Callable[[], None]) -> None:
        self._job = (job, done)
        self._go.release()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            job, done = self._job
            self._job = None
            try:
                job()
            finally:
                with self._lock:    # idle again before it reports, so the next run finds it
                    self._idle.append(self)
                done()


def _run_on_threads(jobs: list[Callable[[], None]], timeout: float) -> bool:
    """Run every job at once, each on its own thread; whether all ended within ``timeout``
    seconds (a job still running then keeps its thread)."""
    left = [len(jobs)]
    finished = threading.Event()
    lock = threading.Lock()

    def done() -> None:
        with lock:
            left[0] -= 1
            if left[0] == 0:
                finished.set()

    threads = [_RankThread.take() for _ in jobs]
    for thread, job in zip(threads, jobs):
        thread.run(job, done)
    return finished.wait(timeout)


def run_fake(size: int, fn: Callable[[FakeCC], Any], *, timeout: float = 10.0,
             synchronous: bool = True, return_ccs: bool = False) -> list:
    """Run ``fn(cc)`` on ``size`` threads and return the results in rank order.

    Args:
        size: number of fake ranks (``>= 1``).
        fn: called once per rank with that rank's :class:`FakeCC`.
        timeout: seconds any single wait may block.
        synchronous: sends complete only when matched (strict); False buffers them.
        return_ccs: return ``(results, ccs)`` so tests can read the traffic counters.

    Raises:
        FakeCommError: a rank broke the contract, hung, or left messages or requests
            behind. Other exceptions raised by ``fn`` propagate (the lowest failing rank's,
            annotated with its rank).
    """
    world = _World(size, timeout, synchronous)
    ccs = [FakeCC(world, r) for r in range(size)]
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def body(rank: int) -> None:
        try:
            results[rank] = fn(ccs[rank])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors[rank] = exc
            with world.cv:
                world.fail()

    if not _run_on_threads([functools.partial(body, r) for r in range(size)], timeout * 4):
        raise FakeCommError(f"a fake rank did not finish within {timeout * 4}s")
    real = [(r, e) for r, e in enumerate(errors)
            if e is not None and not isinstance(e, _AbortedError)]
    if real:
        rank, exc = real[0]
        add_note(exc, f"(raised on fake rank {rank} of {size})")
        raise exc
    leftovers = [f"{len(q)} unreceived message(s) {s}->{d}" for (s, d), q in world.sends.items()
                 if q]
    leftovers += [f"{len(q)} unmatched receive(s) {s}->{d}" for (s, d), q in world.recvs.items()
                  if q]
    leftovers += [f"rank {r} never waited on {len(p)} request(s)"
                  for r, p in enumerate(world.pending) if p]
    if leftovers:
        raise FakeCommError("; ".join(leftovers))
    return (results, ccs) if return_ccs else results


def on_fake_hosts(hostmap: list[int], fn: Callable[[FakeCC], Any], **kwargs) -> list:
    """Run ``fn(cc)`` on fake ranks whose communicator has the host layout ``hostmap``
    (the host of each rank; ``cc.comm.host_layout`` as :func:`pycomm.launch.bootstrap.host_layout`
    builds it); returns ``[(result, bytes this rank sent to other hosts)]`` in rank order.
    ``kwargs`` go to :func:`run_fake`."""
    from pycomm.launch.bootstrap import host_layout
    infos = [{"host": f"h{h}/boot/shm", "hostname": f"node{h}"} for h in hostmap]

    def body(cc):
        cc.comm = type("Comm", (), {"host_layout": host_layout(infos, cc.rank),
                                    "transport_name": "shm+tcp"})()
        cc.link_bytes = 0
        plain = cc.isend

        def isend(buf, dest):
            if hostmap[dest] != hostmap[cc.rank]:
                cc.link_bytes += buf.nbytes
            return plain(buf, dest)
        cc.isend = isend            # send and sendrecv go through it
        return fn(cc), cc.link_bytes
    return run_fake(len(hostmap), body, **kwargs)


def each_case(cases, check: Callable[..., None], name: Callable[[Any], str] = str) -> None:
    """``check(case)`` for every case of ``cases``, every one even after a failure: for the
    innermost parameter of a fake-rank test, looped over instead of one pytest item per
    value (the checks are the same, without pytest's per-item cost). If any case fails,
    an AssertionError names each failing case (``name(case)``) with its error, the first
    error chained."""
    failed = []
    for case in cases:
        try:
            check(case)
        except Exception as exc:      # a failed assertion, or the algorithm's own error
            failed.append((name(case), exc))
    if failed:
        lines = "\n".join(f"  case {key}: {type(exc).__name__}: {exc}" for key, exc in failed)
        raise AssertionError(f"{len(failed)} of {len(cases)} cases failed:\n{lines}") \
            from failed[0][1]
