"""Progress and waiting for the p2p engine: spin, then sleep in the kernel.

Progress happens only inside pycomm calls: blocking calls and ``Wait``/``Test`` drive every
transport until their request completes (no background thread unless a nonblocking
collective starts one). A waiting rank spins for ``PYCOMM_SPIN_US`` microseconds and then
sleeps in the kernel (futex or select), waking every 0.25 s to check that its peers are
alive. :class:`Waiting` is the half of :class:`pycomm.p2p.Engine` that does this; it reads
the engine's ``transports``, ``timeout``, ``spin_s``, ``yield_s`` and thread flags, and its
``_describe_timeout`` names what timed out.

When a host's ranks outnumber its cores, a rank between spinning and sleeping polls for
``PYCOMM_YIELD_US`` more, calling ``sched_yield`` between polls (Open MPI turns its
``mpi_yield_when_idle`` on by itself when oversubscribed; MPICH's nemesis yields after
``MPID_NEM_POLLS_BEFORE_YIELD`` polls). A yielding rank gives its core to a peer that has
work, yet stays runnable: the peer that hands it a message needs no ``FUTEX_WAKE`` and it
needs no trip through the scheduler's wake-up path, which is what a step costs when ranks
sleep (the measured ``wake`` of :mod:`pycomm.tuning.tune`). Only single-threaded engines yield:
once a nonblocking collective has started the progress thread, waiting threads share the
GIL and one sleeper slot in the transport (below), and yielding was not measured there.

Threads: one thread of a rank at a time waits in the engine (:mod:`pycomm.threadlevel`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING

from transports import PeerLostError, TransportError

from . import trace
from .errors import CommTimeoutError, PeerError

if TYPE_CHECKING:
    from .request import Request

__all__ = ["Waiting", "OFFLOADED", "available_cores", "default_spin_seconds",
           "default_yield_seconds"]

_perf = time.perf_counter
_LIVENESS_S = 0.25
# How long a timed-out wait on a nonblocking collective waits for the progress thread that
# has just left the collective to post its outcome (an error that names the call).
_ENDING_GRACE_S = 0.5
# How long a rank waits to be stopped by the launcher before it reports a peer that left
# on purpose (see Waiting.await_stop_after).
_STOP_WAIT_S = 5.0
# Request.expect of a nonblocking collective: only the progress thread completes it.
OFFLOADED = -3
# Request.expect of a wait on a peer's shared-memory word (pycomm.shmcoll's slots): named so
# in a timeout's message
SHARED_WAIT = -4


class Waiting:
    """Progress, waits with timeouts, and the switch to thread safety."""

    # the stall inspector (pycomm.stall.Inspector), set by bootstrap when the world has
    # a store; None: stalls are not inspected, timeouts still name the call
    _inspector = None

    # -- progress and waiting -------------------------------------------------------------
    def progress(self) -> bool:
        """Drive every transport once; True when anything moved.

        Raises:
            PeerError: a peer died or a link failed.
            ThreadLevelError: another thread of this rank is waiting in pycomm.
        """
        if self._waiter is not None:
            self._check_thread()
        busy = False
        try:
            self._polling = True
            try:
                for t in self.transports:
                    if t.progress():
                        busy = True
            finally:
                self._polling = False
            if self.outbox:
                self.act()
        except TransportError as exc:
            raise self._peer_error(exc) from None
        return busy

    def _peer_error(self, exc: TransportError) -> PeerError:
        call = self._my_call()          # an error path: naming the call costs nothing here
        where = f"{trace.describe_call(call)}: " if call is not None else ""
        if isinstance(exc, PeerLostError):
            err = PeerError(f"rank {self.rank}: {where}{exc}", exc.peer)
        else:
            err = PeerError(f"rank {self.rank}: {where}transport failure: {exc}")
        self._failed = err
        return err

    def wait(self, req: "Request", timeout: float | None = None) -> None:
        """Drive progress until ``req`` completes; raise its error if it has one.

        Raises:
            CommTimeoutError: not complete within ``timeout`` seconds (default: engine's).
            PeerError: a peer died or a link failed while waiting.
            TruncationError: the message was larger than the receive buffer.
            ThreadLevelError: another thread of this rank is waiting in pycomm.
        """
        if not req.done:
            held = self._hold()
            try:
                self._wait(req, timeout)
            finally:
                if held:
                    self._release()
        if req.error is not None:
            raise req.error

    def _wait(self, req: "Request", timeout: float | None) -> None:
        if req.expect == OFFLOADED and self._threaded:
            self._wait_offloaded(lambda: req.done, timeout, req)
        elif len(self.transports) == 1 and not self._threaded and not self._yield_gil:
            spin_end = _perf() + self.spin_s
            posted = self.posted
            if len(posted) == 1 and posted[0] is req and req.sig is None and \
                    req.expect == -1 and req.view is not None and req.peer >= 0 and \
                    req.tag >= 0 and not (self.unexpected or self._incoming or self.outbox):
                # The one receive posted, of a named peer and tag (an Irecv's wait): take
                # its message straight from the transport as a blocking Recv does
                # (recv_now), spinning there, without the general path's decoder,
                # matching and completion.
                if self.take_now(req):
                    return
            if not self._spin((req,), spin_end):
                self._wait_slow(lambda: req.done, timeout, req, spin=False)
        else:
            self.progress()
            if not req.done:
                self._wait_slow(lambda: req.done, timeout, req)

    def _spin(self, reqs, spin_end: float) -> bool:
        """Poll the one transport until every request of ``reqs`` completes (True) or
        ``spin_end`` passes (False); no thread check or closure per turn, as in
        :meth:`_wait_slow`: a small message's latency is mostly this loop's period.
        Raises PeerError: a peer died or a link failed."""
        poll = self.transports[0].progress
        outbox = self.outbox
        try:
            if outbox:                  # left by a progress() that raised
                self.act()
            self._polling = True
            try:
                while True:
                    for x in reqs:
                        if not x.done:
                            break
                    else:
                        return True
                    if poll():
                        if outbox:
                            self._polling = False
                            self.act()
                            self._polling = True
                    elif _perf() >= spin_end:
                        return False
            finally:
                self._polling = False
        except TransportError as exc:
            raise self._peer_error(exc) from None

    def wait_all(self, reqs, timeout: float | None = None) -> None:
        """Drive progress until every request in ``reqs`` completes (errors raised after).

        Raises:
            ThreadLevelError: another thread of this rank is waiting in pycomm.
            CommTimeoutError, PeerError, TruncationError: as :meth:`wait`.
        """
        for r in reqs:
            if not r.done:
                held = self._hold()
                try:
                    self._wait_all(reqs, timeout)
                finally:
                    if held:
                        self._release()
                break
        for r in reqs:
            if r.error is not None:
                raise r.error

    def _wait_all(self, reqs, timeout: float | None) -> None:
        pending = [x for x in reqs if not x.done]
        if not pending:     # another thread's progress completed them since wait_all looked
            return
        if len(pending) == 1:   # (an exchange's receive, its eager send complete already)
            self._wait(pending[0], timeout)
            return
        if self._threaded and all(x.expect == OFFLOADED for x in pending):
            self._wait_offloaded(lambda: all(x.done for x in pending), timeout, pending[0])
            return
        spin = len(self.transports) != 1 or self._threaded or self._yield_gil
        if spin:
            self.progress()
        elif self._spin(pending, _perf() + self.spin_s):
            return
        pending = [x for x in pending if not x.done]
        if pending:
            self._wait_slow(lambda: all(x.done for x in pending), timeout, pending[0],
                            spin=spin)

    def wait_until(self, cond, timeout: float | None = None, what: str = "operation",
                   req=None, awaits: int | None = None) -> None:
        """Drive progress until ``cond()`` is true (used by Probe, the object layer and the
        shared-memory collectives). ``req``: what a timeout or stall warning names as
        awaited (anything with ``peer``, ``tag`` and ``expect``), or None. ``awaits``: the
        world rank the wait depends on when ``req`` names none (a Probe's source), for the
        stopped-peer check.

        Raises:
            ThreadLevelError: another thread of this rank is waiting in pycomm.
            CommTimeoutError, PeerError: as :meth:`wait`.
        """
        if not cond():
            held = self._hold()
            try:
                self.progress()
                self._wait_slow(cond, timeout, req, what, awaits=awaits)
            finally:
                if held:
                    self._release()

    def _wait_offloaded(self, cond, timeout, req) -> None:
        """Wait for requests only the progress thread completes (nonblocking collectives).

        This thread neither drives progress nor sleeps in a transport: the progress thread
        does both, and signals the engine's condition when a collective completes. Were
        both threads to drive the engine, every message would be handed between them (the
        engine lock, the GIL, the single sleeper in the transport), several times slower
        than the blocking twin (benchmarks/README.md, "Measurements behind design choices
        in the code").
        A dead peer still ends the wait: the progress thread's own bounded waits fail the
        collective's request with the error.

        Raises:
            CommTimeoutError: not complete within ``timeout`` seconds (default: engine's),
                or ``_ENDING_GRACE_S`` later when the progress thread had just left the call.
        """
        limit = self.timeout if timeout is None else timeout
        deadline = _perf() + limit
        with self._done_cv:
            while not cond():
                left = deadline - _perf()
                if left <= 0:
                    if trace.current(True) is None and self._done_cv.wait_for(
                            cond, _ENDING_GRACE_S):
                        # the progress thread had just left its call, and its outcome (an
                        # error naming the call, from the same limit) was on its way
                        return
                    raise self._offloaded_timeout(limit)
                self._done_cv.wait(min(left, _LIVENESS_S))

    def _wait_slow(self, cond, timeout, req, what: str = "operation",
                   spin: bool = True, awaits: int | None = None) -> None:
        progress = self.progress
        now = _perf()
        spin_end = now + self.spin_s if spin else now
        yield_gil = self._yield_gil
        # the progress thread itself need not yield to the collective it is running
        others = self._threaded and threading.get_ident() != self.offload_ident
        while not cond():
            if progress():
                continue
            if _perf() >= spin_end:
                break
            # Let another thread that needs the GIL have it (else it waits for the 5 ms
            # switch interval): a transport's own thread, or the progress thread while it
            # runs a collective. Only then: sleep(0) costs timer slack that slows every
            # blocking call several times (benchmarks/README.md, "Measurements behind...").
            if yield_gil or (others and self.offload_running):
                time.sleep(0)
        else:
            return
        if self.yield_s > 0.0 and not self._threaded:
            yield_end = _perf() + self.yield_s
            sched_yield = os.sched_yield
            while not cond():
                if progress():
                    continue
                if _perf() >= yield_end:
                    break
                sched_yield()
            else:
                return
        limit = self.timeout if timeout is None else timeout
        deadline = now + limit
        next_check = _perf() + _LIVENESS_S
        inspector = self._inspector
        warn_at = now + inspector.warn_s if inspector is not None and \
            inspector.warn_s < limit else float("inf")
        stalled = None                      # the suspects of the last warning printed
        ts = self.transports
        watch_after = [w for tr in ts if (w := getattr(tr, "watch_after", None)) is not None]
        watch_at = now + min(watch_after) if watch_after else float("inf")
        began = time.monotonic()            # a peer's stop counts from here at the earliest
        single = ts[0] if len(ts) == 1 else None
        while not cond():
            if progress():
                continue
            t = _perf()
            if t >= deadline:
                raise self._timeout_error(req, what, limit)
            if t >= next_check:
                next_check = t + _LIVENESS_S
                try:
                    for tr in ts:
                        tr.check_peers()
                    self._fail_departed()
                except TransportError as exc:
                    raise self._peer_error(exc) from None
                if t >= watch_at:
                    self._check_running(req, awaits, began)
                if t >= warn_at:            # asks the others: a slow path, once per warn_s
                    warn_at = t + inspector.warn_s
                    stalled = self._warn_stall(req, what, t - now, stalled)
                    next_check = _perf() + _LIVENESS_S
            slice_ = min(deadline - t, next_check - t)
            try:
                if self._threaded:
                    self._block_shared(cond, slice_)
                elif single is not None:
                    single.block(slice_)
                elif ts:                    # several media: share the wait between them
                    for tr in ts:
                        tr.block(min(slice_, 0.001))
                else:                       # no peers at all: nothing can wake us early
                    time.sleep(min(slice_, 0.001))
            except TransportError as exc:
                raise self._peer_error(exc) from None
        if stalled is not None:
            inspector.waiting_for = None

    def _check_running(self, req, awaits: int | None, awake_since: float) -> None:
        """Fail the wait if a peer it needs is known not to run (its process stopped).

        The peers it needs: those of ``req``, ``awaits`` (a Probe's source), the posted
        receives and the large messages in flight (a receive from any source names none).
        A transport that can tell (TCP between hosts: :mod:`transports.procwatch`) answers
        without blocking; a slow or busy peer, even in a C call holding its GIL, runs. A
        stop counts from ``awake_since`` (the wait's start) or this rank's own last stop.

        Raises:
            PeerError: naming the peer, its host and why it does not run.
        """
        peers = {r.peer for r in self.posted}
        peers.update(r.peer for r in self.rndv.sends.values())
        peers.update(r.peer for r in self.rndv.recvs.values() if not r.done)
        peers.add(getattr(req, "peer", None))
        peers.add(awaits)
        peers = [p for p in peers if p is not None and 0 <= p != self.rank]
        for tr in self.transports:
            ask = getattr(tr, "not_running", None)      # a test's fake link has none
            found = ask(peers, awake_since) if ask is not None else None
            if found is not None:
                call = self._my_call()
                where = f"{trace.describe_call(call)}: " if call is not None else ""
                err = PeerError(f"rank {self.rank}: {where}rank {found[0]} does not run: "
                                f"{found[1]}", found[0])
                self._failed = err
                raise err

    def await_stop_after(self, peers) -> None:
        """Before reporting that world ranks ``peers`` have left: if one left on purpose
        (``sys.exit`` under pycomm.MPI: :mod:`pycomm.MPI.exitnote`), drive progress up to
        ``_STOP_WAIT_S`` while the launcher, which ends the job on a non-zero exit, stops
        this rank: it then ends silently, as under ``mpiexec``, however long the peer's
        teardown after its goodbye. An exit with code 0 is reported after the wait."""
        inspector = self._inspector
        if inspector is None or not any(inspector.left_on_purpose(p) for p in peers):
            return
        end = _perf() + _STOP_WAIT_S
        while _perf() < end:
            if not self.progress():
                time.sleep(0.01)

    def _fail_departed(self) -> None:
        """Fail the requests that wait for a peer which has closed cleanly.

        A rank that finished its program closes pycomm and says goodbye (so that its exit
        is no crash); a receive from it, or a large send it was to read, can then never
        complete: fail them with a PeerError now rather than at the timeout.
        """
        gone: set[int] = set()
        for tr in self.transports:
            gone.update(tr.closed_peers())
        if not gone:
            return
        self.progress()                 # whatever they sent before closing is in by now
        lock = self.lock
        if lock is not None:
            with lock:
                self._fail_waits_on(gone)
        else:
            self._fail_waits_on(gone)

    def _fail_waits_on(self, gone: set[int]) -> None:
        rndv = self.rndv                # the large messages in flight (pycomm.rendezvous)
        posted = [r for r in self.posted if r.peer in gone]
        sends = [(sid, r) for sid, r in rndv.sends.items() if r.peer in gone]
        reads = [(rid, r) for rid, r in rndv.recvs.items() if r.peer in gone and not r.done]
        if not (posted or sends or reads):
            return
        self.await_stop_after(sorted({r.peer for r in posted} | {r.peer for _, r in sends} |
                                     {r.peer for _, r in reads}))
        call = self._my_call()
        where = f"{trace.describe_call(call)}: " if call is not None else ""
        for r in posted:
            self.posted.remove(r)
        for sid, _ in sends:
            rndv.sends.pop(sid, None)
            rndv.release(sid)
        for rid, _ in reads:
            rndv.recvs.pop(rid, None)
        for r in posted + [r for _, r in sends] + [r for _, r in reads]:
            r.error = PeerError(f"rank {self.rank}: {where}rank {r.peer} has left: it closed "
                                "pycomm (its program ended) while this rank waits for it",
                                r.peer)
            r._complete()

    # -- stalls and timeouts (see pycomm.stall) -------------------------------------------
    def _my_call(self):
        """The flight-recorder entry of the call this thread waits in, or None."""
        return trace.current(self._threaded and
                             threading.get_ident() == self.offload_ident)

    def _warn_stall(self, req, what, waited: float, previous: str | None) -> str:
        """Ask the other ranks where they are; print a warning when the suspects are new.
        Returns the suspects (as text) for the next call's ``previous``."""
        call = self._my_call()
        peer = req.peer if req is not None and req.peer >= 0 else None
        text, culprits = self._inspector.inspect(peer, call, check=True)
        seen = f"{culprits}" if text else ""
        if text and seen != previous:       # warn again only when the suspects change
            name = trace.describe_call(call) if call is not None else what
            wait = f" for rank {peer}" if peer is not None else ""
            sys.stderr.write(f"pycomm: rank {self.rank}: warning: {name} has waited "
                             f"{waited:.1f} s{wait} (PYCOMM_STALL_WARN="
                             f"{self._inspector.warn_s:g}): {text}\n")
            sys.stderr.flush()
        return seen or previous or ""

    def _offloaded_timeout(self, limit: float) -> CommTimeoutError:
        """The timeout of a Wait on a nonblocking collective: names the one the progress
        thread is running and, with a store, why it stalled."""
        call = trace.current(True)
        text = (f"rank {self.rank}: nonblocking collective "
                f"{trace.describe_call(call) + ' ' if call is not None else ''}did not "
                f"complete within {limit:g} s (PYCOMM_TIMEOUT)")
        culprits: list = []
        if call is not None and self._inspector is not None:
            why, culprits = self._inspector.inspect(None, call)
            if why:
                text += f"; {why}"
        exc = CommTimeoutError(text)
        exc.culprits = culprits
        return exc

    def _timeout_error(self, req, what, limit) -> CommTimeoutError:
        """The timeout of a wait, naming the call and, with a store, why it stalled (the
        error's ``culprits``: world ranks that never joined it)."""
        text = self._describe_timeout(req, what, limit)
        call = self._my_call()
        if call is None:
            return CommTimeoutError(text)
        prefix = f"rank {self.rank}: "
        text = f"{prefix}{trace.describe_call(call)}: {text.removeprefix(prefix)}"
        culprits: list = []
        if self._inspector is not None:
            peer = req.peer if req is not None and req.peer >= 0 else None
            why, culprits = self._inspector.inspect(peer, call, check=True)
            if why:
                text += f"; {why}"
        exc = CommTimeoutError(text)
        exc.culprits = culprits
        return exc


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, else the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


def default_spin_seconds(local_size: int) -> float:
    """50 µs of spinning, or 5 µs when this host's ranks outnumber its cores."""
    return 50e-6 if local_size <= available_cores() else 5e-6


def default_yield_seconds(local_size: int) -> float:
    """No yielding phase, or 300 µs of it when this host's ranks outnumber its cores."""
    return 0.0 if local_size <= available_cores() or not hasattr(os, "sched_yield") else 300e-6
