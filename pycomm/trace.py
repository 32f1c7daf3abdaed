"""The flight recorder: every rank's last calls, for post-mortems and timelines.

Each rank keeps its last ``PYCOMM_TRACE_CALLS`` calls (collectives, blocking
point-to-point, request waits) in a ring of preallocated slots: the operation, the
communicator (name and context id), the call's sequence number (a collective's tag, a
point-to-point call's tag), bytes, algorithm, peer (world rank, point-to-point), start and
end times, and a state (running, done, or error with its text). Recording a call costs
one tuple, one slot write and two clock reads; nothing else runs on the fast path (its
cost on an 8 B all-reduce: benchmarks/README.md, "Flight recorder").

The ring is printed (human-readable, to stderr):

* when a :class:`~pycomm.errors.CommError` other than a truncation leaves a recorded call
  (its last :data:`ERROR_DUMP_CALLS` calls; once per exception);
* on ``SIGUSR1`` (the whole ring; the handler is installed at ``pycomm.init()`` unless the
  program has its own), which is how the launcher gets a hung rank's last words;
* at exit when ``PYCOMM_TRACE=path`` is set. Each rank then also writes
  ``path.rank<k>.json``, a Chrome-trace / Perfetto timeline (``{"traceEvents": [...]}``,
  one complete ``"X"`` event per call, ``pid`` = world rank, ``tid`` 0 for the calling
  thread and 1 for nonblocking collectives on the progress thread, timestamps in
  microseconds of wall-clock time so that ranks line up) of *every* call of the run: with
  the variable set, calls the ring overwrites are kept in a list. ``launch.py`` merges the
  ranks' files into ``path`` when the job ends (open it in ui.perfetto.dev or
  chrome://tracing).

Op names: a collective is recorded under its registry key ("allreduce", shown
"Allreduce"; its nonblocking twin "iallreduce", shown "Iallreduce"), point-to-point under
its MPI name ("Send", "Recv", "Sendrecv", "Wait", "Waitall", "Waitany").
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import signal
import sys
import threading
import time

from . import config
from .errors import CommError, TruncationError

__all__ = ["ERROR_DUMP_CALLS", "begin", "chrome_events", "collective_progress",
           "collective_signatures", "current", "describe_call", "display_name", "dump", "end",
           "fail", "format_calls", "install", "last_completed", "last_failed",
           "merge_chrome_traces", "on_sigusr1", "record_wait", "reroute", "reroute_call", "ring",
           "traced",
           "write_chrome_trace"]

ERROR_DUMP_CALLS = 32  # calls printed when an error leaves a call (SIGUSR1: the whole ring)

_now = time.perf_counter_ns
_cap = max(1, int(config.get("PYCOMM_TRACE_CALLS")))
_calls: list = [None] * _cap    # slot -> (op, comm, seq, nbytes, algorithm, peer, t0, n)
_ends: list = [0] * _cap        # slot -> end in ns; the call runs while this is < its t0
_errors: dict = {}              # call number -> error text: failed calls only
_counter = itertools.count()    # next() is atomic under the GIL: two threads record
_spill: list | None = None      # PYCOMM_TRACE: calls the ring overwrote, kept for the JSON
_keeping: list = [None]         # [_keep] once PYCOMM_TRACE keeps them (see ring)
_rank = 0
_installed = False
# perf_counter_ns -> wall-clock ns, fixed once, so that the ranks' timelines line up
_WALL_OFFSET = time.time_ns() - time.perf_counter_ns()


def begin(op: str, comm, seq: int, nbytes: int, algorithm: str | None, peer: int) -> int:
    """Record the start of a call; return its number (for :func:`end` / :func:`fail`).

    Args:
        op: registry key of a collective ("allreduce"; "i"-prefixed when nonblocking) or
            the MPI name of a point-to-point call ("Send").
        comm: the communicator (its ``name`` and ``_cid`` are read when printing).
        seq: the collective's sequence number, or the point-to-point tag.
        nbytes: bytes of the call as the selection sees them.
        algorithm: the algorithm's name, or None.
        peer: world rank of a point-to-point peer, -1 for none.
    """
    n = next(_counter)
    _calls[n % _cap] = (op, comm, seq, nbytes, algorithm, peer, _now(), n)
    return n


def _begin_keeping(op: str, comm, seq: int, nbytes: int, algorithm: str | None,
                   peer: int) -> int:
    """:func:`begin` with ``PYCOMM_TRACE``: the call the slot held is kept for the JSON."""
    n = next(_counter)
    i = n % _cap
    if _calls[i] is not None:
        _keep(i)
    _calls[i] = (op, comm, seq, nbytes, algorithm, peer, _now(), n)
    return n


def instant(op: str, comm, seq: int, nbytes: int, peer: int) -> None:
    """Record a point-to-point call that completed within the call itself (an eager Send
    whose frame the transport took at once); arguments as for :func:`begin`."""
    n = next(_counter)
    i = n % _cap
    if _spill is not None and _calls[i] is not None:
        _keep(i)                        # PYCOMM_TRACE: as _begin_keeping
    t = _now()
    _calls[i] = (op, comm, seq, nbytes, None, peer, t, n)
    _ends[i] = t


def ring():
    """``(calls, ends, counter, cap, now, keeping)`` for a caller that records a call as
    :func:`begin` and :func:`end` do, in its own frame
    (:meth:`pycomm.calls.CollectiveCalls.fast_runner`, where a small call pays for each
    Python call it makes): the ring's lists, its call counter, its size, its clock, and a
    one-item list holding ``keep(slot)``, to call before overwriting a used slot, or None
    (no ``PYCOMM_TRACE``: the ring forgets what it overwrites). The list, not its item,
    is for keeping: :func:`install` fills it later than the caller may have asked (a
    world's start-up plans its first calls before the rank installs the recorder)."""
    return _calls, _ends, _counter, _cap, _now, _keeping


def end(n: int) -> None:
    """Record that call ``n`` completed (ignored when the ring has reused its slot)."""
    i = n % _cap
    if _calls[i][7] == n:
        _ends[i] = _now()


def reroute(n: int, algorithm: str) -> None:
    """Record that call ``n`` runs by ``algorithm`` after all (a call through the
    shared-memory slots whose peer runs it by messages)."""
    i = n % _cap
    call = _calls[i]
    if call is not None and call[7] == n:
        _calls[i] = call[:4] + (algorithm,) + call[5:]


def reroute_call(comm, seq: int, algorithm: str) -> None:
    """:func:`reroute` the latest running call of ``comm`` numbered ``seq`` (a kernel
    through the slots or direct reads, which is not handed its call's number, falling
    back to messages; only the few calls begun since are looked at)."""
    top = _top()
    for n in range(top - 1, max(-1, top - 1 - min(_cap, 8)), -1):
        call = _calls[n % _cap]
        if call is not None and call[7] == n and call[1] is comm and call[2] == seq:
            reroute(n, algorithm)
            return


def fail(n: int, exc: BaseException) -> None:
    """Record that call ``n`` raised ``exc``; print the ring for a CommError (once per
    exception) and tell the stall inspector, which publishes whom the error blames."""
    i = n % _cap
    if _calls[i][7] == n:
        _ends[i] = _now()
        if len(_errors) >= _cap:        # forget errors the ring has overwritten
            for old in [k for k in _errors if k < n - _cap]:
                del _errors[old]
        _errors[n] = f"{type(exc).__name__}: {exc}"
    # A truncation is the caller's own buffer, named in the error: the calls before it
    # tell nothing more, and a program that expects it (mpi4py's ERR_TRUNCATE) gets no
    # report on stderr, as under MPI
    if not isinstance(exc, CommError) or isinstance(exc, TruncationError) or \
            getattr(exc, "_pycomm_reported", False):
        return
    try:
        exc._pycomm_reported = True
    except AttributeError:
        pass
    dump(limit=ERROR_DUMP_CALLS, why=f"{type(exc).__name__} left a call")
    if _on_error is not None:
        try:
            call = _calls[i]
            _on_error(exc, describe_call(call) if call[7] == n else "")
        except Exception:  # noqa: BLE001, S110 - reporting must never mask the error itself
            pass


_on_error = None     # set by the stall inspector: publishes the error's culprits


def record_wait(comm, reqs: list, timeout: float | None) -> None:
    """Wait for the requests of a blocking point-to-point call, recording it.

    ``Communicator._wait_posted`` calls this: the op is Send, Recv or Sendrecv by the
    requests it waits for (requests marked ``expect == -2`` are sends).

    Raises:
        whatever :meth:`pycomm.p2p.Engine.wait` / ``wait_all`` raise.
    """
    engine = comm._engine
    r = reqs[0]
    if len(reqs) == 1:
        n = begin("Send" if r.expect == -2 else "Recv", comm, r.tag, r.nbytes, None, r.peer)
    else:
        recv = reqs[-1]
        n = begin("Sendrecv", comm, recv.tag, r.nbytes, None, recv.peer)
    try:
        if len(reqs) == 1:
            engine.wait(r, timeout)
        else:
            engine.wait_all(reqs, timeout)
    except BaseException as exc:
        fail(n, exc)
        raise
    end(n)


def traced(op: str, comm, seq: int, nbytes: int, peer: int, fn, *args):
    """Run ``fn(*args)`` as a recorded call (a request's Wait, Waitall, Waitany)."""
    n = begin(op, comm, seq, nbytes, None, peer)
    try:
        out = fn(*args)
    except BaseException as exc:
        fail(n, exc)
        raise
    end(n)
    return out


def _keep(i: int) -> None:
    call = _calls[i]
    t1 = _ends[i]
    _spill.append((call, t1 if t1 >= call[6] else 0, _errors.pop(call[7], None)))


# -- reading the ring -----------------------------------------------------------------------
def _snapshot(limit: int | None = None) -> list:
    """The recorded calls, oldest first: ``(number, call, end_ns, error text or None)``."""
    top = _top()
    first = max(0, top - _cap)
    if limit is not None:
        first = max(first, top - limit)
    out = []
    for n in range(first, top):
        i = n % _cap
        call = _calls[i]
        if call is None or call[7] != n:
            continue
        t1 = _ends[i]
        out.append((n, call, t1 if t1 >= call[6] else 0, _errors.get(n)))
    return out


def _top() -> int:
    """One past the number of the last call begun (read without taking a number)."""
    return int(repr(_counter)[6:-1])        # "count(57)"


def display_name(op: str) -> str:
    """``"allreduce"`` -> ``"Allreduce"``, ``"iallreduce"`` -> ``"Iallreduce"``."""
    return op[:1].upper() + op[1:] if op[:1].islower() else op


def _is_collective(op: str) -> bool:
    return op[:1].islower()


def _comm_name(comm) -> str:
    return getattr(comm, "name", "?") if comm is not None else "-"


def describe_call(call) -> str:
    """E.g. ``"Allreduce #57 on pycomm.COMM_WORLD"`` or ``"Recv from rank 2 (tag 7)"``."""
    op, comm, seq, _nbytes, _alg, peer = call[:6]
    if _is_collective(op):
        return f"{display_name(op)} #{seq} on {_comm_name(comm)}"
    who = f"rank {peer}" if peer >= 0 else "any rank"     # -2: ANY_SOURCE
    where = f" from {who}" if op == "Recv" else f" to {who}" if op == "Send" \
        else f" with rank {peer}" if peer >= 0 else ""
    tag = f" (tag {seq})" if seq >= 0 else ""
    return f"{op}{where}{tag}" + (f" on {_comm_name(comm)}" if comm is not None else "")


def _is_nonblocking(op: str) -> bool:
    return op[:1] == "i"                # no collective's registry key starts with "i"


def current(nonblocking: bool | None = None):
    """The call this rank is in: the latest running collective, else the latest running
    call; None when it is in no recorded call. Read from any thread (racy, best effort).

    Args:
        nonblocking: True: only nonblocking collectives (the progress thread's calls);
            False: only the calling thread's calls; None: any.
    """
    running = [c for _n, c, t1, _e in _snapshot(64) if t1 == 0 and
               (nonblocking is None or _is_nonblocking(c[0]) == nonblocking)]
    for call in reversed(running):
        if _is_collective(call[0]):
            return call
    return running[-1] if running else None


def last_completed():
    """``(call, end_ns)`` of the latest call that completed without error, or None."""
    for _n, call, t1, err in reversed(_snapshot()):
        if t1 and err is None:
            return call, t1
    return None


def last_failed():
    """``(call, end_ns, error text)`` of the latest call that raised, when no call has
    completed since; else None."""
    for _n, call, t1, err in reversed(_snapshot()):
        if t1:
            return (call, t1, err) if err is not None else None
    return None


def _collective_comms() -> dict:
    """``{context id: communicator}`` of every communicator with a collective in the ring."""
    seen = {}
    for _n, call, _t1, _e in _snapshot():
        comm = call[1]
        if comm is not None and _is_collective(call[0]):
            seen[getattr(comm, "_cid", -1)] = comm
    return seen


def collective_progress() -> dict:
    """``{context id: sequence number of the last collective begun}`` for every
    communicator seen in the ring (its call counter: authoritative, not limited to the
    ring)."""
    return {cid: int(c._calls.seq) for cid, c in _collective_comms().items()}


def collective_signatures() -> dict:
    """``{collective context: [seq, code, count]}``: the signature
    (:func:`pycomm.signature.signature`) of the last collective begun on every
    communicator seen in the ring, keyed by the context its collective messages travel on
    (unique among this rank's communicators); none for a context whose calls are not
    numbered in order (``Create_group``'s)."""
    out = {}
    for c in _collective_comms().values():
        eng, ctx = getattr(c, "_engine", None), getattr(c, "_cctx", None)
        if eng is None or ctx is None or ctx in eng.unordered:
            continue
        cur = eng.current.get(ctx)      # (seq, sig, world): one tuple, written at once
        if cur is not None and cur[1] is not None:
            out[ctx] = [int(cur[0]), int(cur[1][0]), int(cur[1][1])]
    return out


def format_calls(calls: list, now_ns: int | None = None) -> list[str]:
    """Human-readable rows for :func:`_snapshot` entries (times in seconds before now)."""
    now_ns = _now() if now_ns is None else now_ns
    rows = [(f"{'call':>6}  {'op':<22} {'comm':<24} {'seq':>6} {'bytes':>10} "
             f"{'algorithm':<20} {'peer':>4} {'started':>10} {'took':>10}  state")]
    for n, (op, comm, seq, nbytes, alg, peer, t0, _n), t1, err in calls:
        took = f"{(t1 - t0) / 1e6:.3f} ms" if t1 else "-"
        state = "running" if not t1 else f"error: {err}" if err else "done"
        rows.append(f"{n:>6}  {display_name(op):<22} {_comm_name(comm)[:24]:<24} {seq:>6} "
                    f"{nbytes:>10} {(alg or '-')[:20]:<20} "
                    f"{peer if peer >= 0 else '-':>4} {(now_ns - t0) / 1e9:>8.3f} s "
                    f"{took:>10}  {state}")
    return rows


def dump(limit: int | None = None, why: str = "", file=None) -> None:
    """Print the last ``limit`` recorded calls (all: None) to ``file`` (stderr), in one
    write so that other output does not interleave."""
    calls = _snapshot(limit)
    total = _top()
    head = (f"pycomm flight recorder, rank {_rank} (pid {os.getpid()})"
            f"{': ' + why if why else ''}: last {len(calls)} of {total} calls "
            f"(PYCOMM_TRACE_CALLS={_cap}), oldest first")
    text = "\n".join([head, *format_calls(calls), "end of flight recorder"]) + "\n"
    out = sys.stderr if file is None else file
    try:
        out.write(text)
        out.flush()
    except (OSError, ValueError):
        pass                    # stderr is gone; nothing to tell


# -- timelines ------------------------------------------------------------------------------
def chrome_events(rank: int | None = None) -> list[dict]:
    """Every kept call as a Chrome-trace complete event (``"ph": "X"``, µs), plus the
    process and thread name events. Running calls end now."""
    rank = _rank if rank is None else rank
    now = _now()
    kept = list(_spill or ())
    kept += [(call, t1, err) for _n, call, t1, err in _snapshot()]
    events = [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
               "args": {"name": f"rank {rank}"}},
              {"name": "thread_name", "ph": "M", "pid": rank, "tid": 0,
               "args": {"name": "calls"}},
              {"name": "thread_name", "ph": "M", "pid": rank, "tid": 1,
               "args": {"name": "nonblocking collectives"}}]
    for (op, comm, seq, nbytes, alg, peer, t0, _n), t1, err in kept:
        nonblocking = _is_nonblocking(op)
        args = {"comm": _comm_name(comm), "cid": getattr(comm, "_cid", -1), "seq": seq,
                "bytes": nbytes, "state": "running" if not t1 else "error" if err else "done"}
        if alg:
            args["algorithm"] = alg
        if peer >= 0:
            args["peer"] = peer
        if err:
            args["error"] = err
        events.append({"name": display_name(op),
                       "cat": "collective" if _is_collective(op) else "p2p",
                       "ph": "X", "pid": rank, "tid": 1 if nonblocking else 0,
                       "ts": (t0 + _WALL_OFFSET) / 1e3,
                       "dur": max(0, (t1 or now) - t0) / 1e3, "args": args})
    return events


def write_chrome_trace(path: str, rank: int | None = None) -> str:
    """Write this rank's timeline to ``path.rank<k>.json``; return the file's name.

    Raises:
        OSError: the file cannot be written.
    """
    rank = _rank if rank is None else rank
    name = f"{path}.rank{rank}.json"
    tmp = name + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"traceEvents": chrome_events(rank), "displayTimeUnit": "ms"}, fh)
    os.replace(tmp, name)
    return name


def merge_chrome_traces(path: str, nranks: int) -> str | None:
    """Merge the ranks' ``path.rank<k>.json`` files into ``path``; return it, or None
    when no rank wrote one (the launcher calls this when the job ends).

    Raises:
        OSError: ``path`` cannot be written.
    """
    events = []
    for r in range(nranks):
        try:
            with open(f"{path}.rank{r}.json") as fh:
                events += json.load(fh)["traceEvents"]
        except (OSError, ValueError, KeyError):
            continue            # a rank that died before exit wrote nothing
    if not events:
        return None
    with open(path + ".tmp", "w") as fh:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, fh)
    os.replace(path + ".tmp", path)
    return path


# -- installation ---------------------------------------------------------------------------
def on_sigusr1(_signum, _frame) -> None:
    """The SIGUSR1 handler :func:`install` sets: print the whole ring."""
    dump(why="SIGUSR1")


def _at_exit(path: str) -> None:
    dump(why=f"exit (PYCOMM_TRACE={path})")
    try:
        write_chrome_trace(path)
    except OSError as exc:
        sys.stderr.write(f"pycomm: rank {_rank}: cannot write the trace {path}: {exc}\n")


def install(rank: int) -> bool:
    """Set this process's rank; install the SIGUSR1 dump and, with ``PYCOMM_TRACE``, the
    exit dump and timeline (idempotent). Returns whether SIGUSR1 now dumps the ring (only
    from the main thread, and only when the program left SIGUSR1 at its default)."""
    global _rank, _installed, _spill, begin
    _rank = rank
    if _installed:
        return signal.getsignal(signal.SIGUSR1) is on_sigusr1
    _installed = True
    path = config.get("PYCOMM_TRACE")
    if path:
        _spill = []
        begin = _begin_keeping
        _keeping[0] = _keep
        atexit.register(_at_exit, path)
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
        signal.signal(signal.SIGUSR1, on_sigusr1)
        return True
    return False
