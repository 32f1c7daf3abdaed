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

Threads. pycomm provides ``THREAD_SERIALIZED``: one thread of a rank at a time may be in a
pycomm call (its own progress thread, :mod:`pycomm.nbc`, is internal). A thread that waits
(:meth:`Waiting.wait`, ``wait_all``, ``wait_until``, in the spin as in the sleep) holds the
engine for the wait; a second thread that then enters the engine (posting, probing,
cancelling, driving progress, waiting) gets :class:`~pycomm.errors.ThreadLevelError` at
once, before it changes anything, naming the rank, both threads and both calls, and the
first thread's call goes on. Taking the engine costs only waits that wait; the engine's
entries test one attribute. While it is held, the engine's ``direct`` table is emptied, so
that the request-free paths of :mod:`pycomm.pt2pt`, which write to and read from a
transport themselves, go through the engine's checked entries instead. A frame the refused
thread must still send (the ABORT of a collective call it abandons, so that the peers do
not wait for it) waits in ``outbox`` for the holder. Not seen: a second thread that enters
while the first is inside pycomm but not waiting (the check is at the engine's entries, and
a small call that needs no wait never takes the engine), nor a collective through shared-
memory slots that completes without waiting or driving progress.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING

from transports import PeerLostError, TransportError

from . import trace
from .errors import CommTimeoutError, PeerError, ThreadLevelError

if TYPE_CHECKING:
    from .request import Request

__all__ = ["Waiting", "OFFLOADED", "available_cores", "default_spin_seconds",
           "default_yield_seconds"]

_perf = time.perf_counter
_LIVENESS_S = 0.25
# Request.expect of a nonblocking collective: only the progress thread completes it.
OFFLOADED = -3
# Request.expect of a wait on a peer's shared-memory word (pycomm.shmcoll's slots): named so
# in a timeout's message
SHARED_WAIT = -4

_get_ident = threading.get_ident
_PKG_DIRS = tuple(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + d
                  + os.sep for d in ("pycomm", "transports"))
# frames of pycomm's own wrappers, which name no call (the collective wrapper's code is
# compiled from text: its call's name is in its globals)
_WRAPPER_FRAMES = {"call", "wrapper", "run", "traced", "generic", "guarded", "<lambda>"}


class Waiting:
    """Progress, waits with timeouts, flush, and the switch to thread safety."""

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
            # Spin on the one transport directly: a small message's latency is
            # mostly the period of this loop.
            poll = self.transports[0].progress
            outbox = self.outbox
            spin_end = _perf() + self.spin_s
            try:
                if outbox:                  # left by a progress() that raised
                    self.act()
                self._polling = True
                try:
                    while not req.done:
                        if poll():
                            if outbox:
                                self._polling = False
                                self.act()
                                self._polling = True
                        elif _perf() >= spin_end:
                            break
                finally:
                    self._polling = False
            except TransportError as exc:
                raise self._peer_error(exc) from None
            if not req.done:
                self._wait_slow(lambda: req.done, timeout, req, spin=False)
        else:
            self.progress()
            if not req.done:
                self._wait_slow(lambda: req.done, timeout, req)

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
        if self._threaded and all(x.expect == OFFLOADED for x in pending):
            self._wait_offloaded(lambda: all(x.done for x in pending), timeout, pending[0])
            return
        self.progress()
        pending = [x for x in pending if not x.done]
        if pending:
            self._wait_slow(lambda: all(x.done for x in pending), timeout, pending[0])

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
            CommTimeoutError: not complete within ``timeout`` seconds (default: engine's).
        """
        limit = self.timeout if timeout is None else timeout
        deadline = _perf() + limit
        with self._done_cv:
            while not cond():
                left = deadline - _perf()
                if left <= 0:
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
        text, culprits = self._inspector.inspect(peer, call)
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
            why, culprits = self._inspector.inspect(peer, call)
            if why:
                text += f"; {why}"
        exc = CommTimeoutError(text)
        exc.culprits = culprits
        return exc

    def flush(self, timeout: float) -> bool:
        """Drive progress until no transport holds frames back (e.g. a FIN waiting for flow
        control credit), or ``timeout`` seconds pass. Call before going idle outside pycomm
        (a pool worker between tasks): a peer may be waiting for those frames.

        Returns:
            True when nothing is held back any more.

        Raises:
            PeerError: a peer died or a link failed.
        """
        deadline = _perf() + timeout
        ts = self.transports
        while any(t.has_backlog() for t in ts):
            if self.progress():
                continue
            left = deadline - _perf()
            if left <= 0:
                return False
            if self._threaded:          # the progress thread may be blocked in a transport
                time.sleep(min(left, 0.001))
            else:
                for t in ts:
                    t.block(min(left, 0.001 if len(ts) > 1 else 0.05))
        return True

    # -- threads --------------------------------------------------------------------------
    # Single-threaded use (the default) takes no locks. The first nonblocking collective
    # calls enable_threads(): from then on every entry point runs under one re-entrant
    # lock, and of the threads that wait, one at a time sleeps in the transport while the
    # others sleep on a condition variable that any progress, or the completion of a
    # nonblocking collective, signals.
    def enable_threads(self) -> None:
        """Make the engine safe for a second thread (idempotent; call from the owner)."""
        if self._threaded:
            return
        lock = threading.RLock()
        self.lock = lock
        self._cv = threading.Condition(lock)
        # signalled only when a nonblocking collective completes: its waiters are not
        # woken by every message the progress thread moves
        self._done_cv = threading.Condition()
        self._blocker = threading.Lock()
        for name in ("isend", "irecv", "iprobe", "cancel"):
            setattr(self, name, _locked(lock, getattr(self, name)))
        raw = self.progress

        def progress() -> bool:
            with lock:
                busy = raw()
                if busy:
                    self._cv.notify_all()
                return busy

        self.progress = progress
        self._threaded = True

    def notify(self) -> None:
        """Wake the threads waiting in this engine (a request completed off-progress)."""
        if self._threaded:
            with self._done_cv:
                self._done_cv.notify_all()
            with self._cv:
                self._cv.notify_all()
            for t in self.transports:       # and whichever thread sleeps in a transport
                t.wakeup()

    def _block_shared(self, cond, slice_: float) -> None:
        ts = self.transports
        if ts and self._blocker.acquire(blocking=False):
            try:
                if len(ts) == 1:
                    ts[0].block(min(slice_, 0.05))
                else:
                    for tr in ts:
                        tr.block(min(slice_, 0.001))
            finally:
                self._blocker.release()
            # Whatever woke this thread (a frame, or a peer's shared-memory slot, which
            # progress() does not see) may be what the other thread waits for: wake it.
            with self._cv:
                self._cv.notify_all()
            return
        with self._cv:
            if not cond():
                self._cv.wait(min(slice_, 0.05))


    # -- one thread at a time (THREAD_SERIALIZED; see the module docstring) --------------
    def _hold(self) -> bool:
        """Mark the engine as held by this thread for a wait; True when this call took the
        mark (the caller then calls :meth:`_release`), False when it held it already or is
        the progress thread, whose waits are internal.

        Raises:
            ThreadLevelError: another thread holds it.
        """
        me = _get_ident()
        if me == self.offload_ident:
            return False
        lock = self._hold_lock
        if not lock.acquire(False):
            holder = self._waiter
            if holder == me:
                return False            # a wait inside this thread's own wait
            # the lock is held but names no thread: its holder is taking or giving it
            # up; wait that out
            if holder is not None or not lock.acquire(timeout=0.05):
                raise self._second_thread(me)
        self._waiter = me
        self.direct = self._no_direct   # pt2pt's request-free paths: through the checks
        return True

    def _release(self) -> None:
        if self.outbox and not self._polling:
            # what a refused thread left to send (an ABORT), sent now rather than at this
            # thread's next progress, which may be long in coming
            try:
                self.act()
            except TransportError:
                pass                    # the next progress reports the dead peer
        self._waiter = None
        self.direct = self._direct_all
        self._hold_lock.release()

    def _check_thread(self) -> None:
        """Raise if another thread holds the engine (an entry point's check, made only
        while some thread holds it)."""
        if self._refused():
            raise self._second_thread(_get_ident())

    def _refused(self) -> bool:
        """Whether this thread is one that :meth:`_check_thread` refuses now."""
        holder = self._waiter
        me = _get_ident()
        return holder is not None and holder != me and me != self.offload_ident

    def _second_thread(self, me: int) -> "ThreadLevelError":
        """The error for thread ``me``, which entered the engine while another waits."""
        holder = self._waiter
        threads = {t.ident: t.name for t in threading.enumerate()}
        mine = threads.get(me, f"#{me}")
        theirs = threads.get(holder, f"#{holder}") if holder is not None else "another"
        frame = sys._current_frames().get(holder) if holder is not None else None
        held_in = _api_call(frame) if frame is not None else None
        if held_in is None:
            call = trace.current(False)
            held_in = trace.describe_call(call) if call is not None else "a blocking call"
        calling = _api_call(sys._getframe(1)) or "pycomm"
        err = ThreadLevelError(
            f"rank {self.rank}: thread {mine!r} called {calling} while thread {theirs!r} "
            f"is waiting in {held_in}: pycomm provides THREAD_SERIALIZED (MPI."
            "Query_thread()), one thread of a rank in pycomm at a time, not "
            "THREAD_MULTIPLE; nothing of this call was done here, the waiting call goes "
            "on, and this one may be made again once it has returned")
        err.rank, err.holder, err.caller = self.rank, theirs, mine
        return err


def _api_call(frame) -> str | None:
    """The pycomm call (as the program made it) that ``frame``'s thread is in, e.g.
    ``Recv(source=1, tag=7) on pycomm.COMM_WORLD``: the outermost frame of pycomm's code
    that names a call, with its rank and tag arguments; None outside pycomm."""
    frames = []
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith(_PKG_DIRS) or \
                code.co_filename == "<pycomm collective wrapper>":
            frames.append(frame)
        elif frames:
            break                       # the program's code that called pycomm
        frame = frame.f_back
    for f in reversed(frames):
        name = f.f_code.co_name
        if name == "wrapper" and "blocking_name" in f.f_globals:
            name = f.f_globals["blocking_name"]
        elif name in _WRAPPER_FRAMES or name.startswith("_"):
            continue
        loc = f.f_locals
        args = ", ".join(f"{k}={loc[k]!r}" for k in ("dest", "source", "root", "tag")
                         if isinstance(loc.get(k), int))
        comm = getattr(loc.get("self"), "name", None)
        where = f" on {comm}" if isinstance(comm, str) else ""
        return f"{name}({args}){where}"
    return None


def _locked(lock, fn):
    def call(*args, **kwargs):
        with lock:
            return fn(*args, **kwargs)
    call.__name__ = fn.__name__
    call.__doc__ = fn.__doc__
    return call


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
