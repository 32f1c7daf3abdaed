"""Threads in the p2p engine: the part of :class:`pycomm.p2p.Engine` that makes it safe for
its progress thread and enforces ``THREAD_SERIALIZED`` for the program's threads.

Once a nonblocking collective starts the progress thread (:mod:`pycomm.nbc`),
:meth:`SerializedThreads.enable_threads` wraps the engine's entries in one lock; waiting
threads then share one sleeper slot in the transports and wake each other through a
condition (:meth:`SerializedThreads.notify`).

pycomm provides ``THREAD_SERIALIZED``: one thread of a rank at a time may be in a pycomm
call (its own progress thread, :mod:`pycomm.nbc`, is internal). A thread that waits
(:meth:`pycomm.waiting.Waiting.wait`, ``wait_all``, ``wait_until``, in the spin as in the
sleep) holds the engine for the wait; a second thread that then enters the engine (posting,
probing, cancelling, driving progress, waiting) gets
:class:`~pycomm.errors.ThreadLevelError` at once, before it changes anything, naming the
rank, both threads and both calls, and the first thread's call goes on. Taking the engine costs only waits that wait; the engine's
entries test one attribute. While it is held, the engine's ``direct`` table is emptied, so
that the request-free paths of :mod:`pycomm.pt2pt`, which write to and read from a
transport themselves, go through the engine's checked entries instead. A frame the refused
thread must still send (the ABORT of a collective call it abandons, so that the peers do
not wait for it) waits in ``outbox`` for the holder. Not seen: a second thread that enters
while the first is inside pycomm but not waiting (the check is at the engine's entries, and
a small call that needs no wait never takes the engine), nor a collective through shared-
memory slots that completes without waiting or driving progress.

:class:`SerializedThreads` reads the engine's ``rank``, ``offload_ident`` (the progress
thread), ``outbox``, ``_polling``, ``act`` and the ``direct`` tables, and owns ``_hold_lock``
and ``_waiter``.
"""

from __future__ import annotations

import os
import sys
import threading

from transports import TransportError

from . import trace
from .errors import ThreadLevelError

__all__ = ["SerializedThreads"]

_get_ident = threading.get_ident
_PKG_DIRS = tuple(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + d
                  + os.sep for d in ("pycomm", "transports"))
# frames of pycomm's own wrappers, which name no call (the collective wrapper's code is
# compiled from text: its call's name is in its globals)
_WRAPPER_FRAMES = {"call", "wrapper", "run", "traced", "generic", "guarded", "<lambda>"}


class SerializedThreads:
    """The engine's threads: the switch to a locked engine when the progress thread starts
    (:meth:`enable_threads`, :meth:`notify`, and the shared sleep of waiting threads), and
    the one-waiter rule (:meth:`_hold` for a wait, :meth:`_check_thread` at the entries;
    see the module docstring)."""

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
            # thread's next progress, which may be long in coming; under the engine's lock,
            # as the progress thread may be acting on the same outbox: a transport is
            # driven by one thread at a time (two one-sided reads at once shared the
            # transport's validity-word scratch: a false "withdrawn by its sender")
            try:
                if self._threaded:
                    with self.lock:
                        if not self._polling:
                            self.act()
                else:
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
