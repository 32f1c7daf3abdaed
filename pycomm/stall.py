"""The stall inspector: when a wait drags on, find out which rank is missing and why.

When a wait passes ``PYCOMM_STALL_WARN`` seconds (below ``PYCOMM_TIMEOUT``), the waiting
rank asks every other rank of the world for its *position* through the rendezvous store,
and prints a warning naming the ranks that have not entered its call and what they last
did: "ranks [2] have not called Allreduce #57 on pycomm.COMM_WORLD; rank 2 last completed
Bcast #56 on pycomm.COMM_WORLD 12.4 s ago, and is in no pycomm call". While the wait
lasts it asks again every ``PYCOMM_STALL_WARN`` seconds (warning again only when the
suspects changed); when the wait times out, the ``CommTimeoutError`` names the call and
carries the same diagnosis, and its ``culprits`` (world ranks) are published for the
launcher (see :mod:`pycomm.launch.launcher`), as is the dead peer of a ``PeerError``.

Nothing is sent on the fast path: a rank answers only when asked. Each rank of a world
with a store runs one *responder* thread, blocked in the store on its own ask key, which
reads the rank's flight recorder (:mod:`pycomm.trace`) when woken. So a rank that hangs in
user code (``time.sleep``, a Python loop) still answers; one stopped, dead or stuck in C
code holding the GIL does not, and is reported as not answering, with its last answer.

Position (msgpack map): ``rank``, ``pid``, ``round``, ``wall`` (time.time() of the
answer), ``running`` (``[op, comm name, cid, seq, peer, seconds running]`` or None),
``waiting_for`` (world rank this rank's stalled wait needs, or None), ``last``
(``[op, comm name, cid, seq, seconds ago]`` of its last completed call, or None),
``failed`` (``[op, comm name, cid, seq, seconds ago, error type]`` of a call that raised
after it, or None),
``comms`` (``{cid: sequence number of its last collective begun}``), ``sigusr1``
(whether SIGUSR1 prints its flight recorder).

Store keys, all under ``pycomm/stall/<job id>/``::

    asks/<r>       counter: how many times rank r was asked
    ask/<r>/<k>    b"?" asks rank r for its k-th answer; b"!" stops its responder
    ans/<r>/<k>    rank r's k-th answer (a position), deleted by whoever asked
    pos/<r>        rank r's latest position (first set when its world starts)
    diag/<r>       why rank r failed: {"culprits": [world ranks], "call": the call the
                   error left (e.g. "Allreduce #4 on pycomm.COMM_WORLD"), "error": text}
    exit/<r>       b"exit": rank r is leaving through a return or ``sys.exit``, with no
                   uncaught exception (published by :mod:`pycomm.MPI` at exit)
    abort#         counter: ranks that called ``Comm.Abort`` (only the first one's note is set)
    abort          msgpack ``[rank, code]``: the first rank that called ``Comm.Abort`` and its
                   code; a launcher that reads it stops every rank at once and exits with
                   the code, as ``mpiexec`` does (:func:`read_abort`)
"""

from __future__ import annotations

import os
import signal
import threading
import time

import msgpack

from . import trace
from .errors import CollectiveMismatchError, CommError, CommTimeoutError, PeerError

__all__ = ["Inspector", "ask_positions", "describe_position", "diagnose", "key", "mismatch",
           "read_diagnoses", "read_exits", "read_positions", "summarize"]

_IDLE_S = 60.0      # seconds one responder wait in the store lasts before it re-parks
_ANSWER_S = 0.5     # seconds an asker waits for the answers of all ranks


def key(job_id: str, *parts: object) -> str:
    """The store key ``pycomm/stall/<job_id>/<parts...>``."""
    return "/".join(("pycomm/stall", job_id, *map(str, parts)))


def position(rank: int, waiting_for: int | None, sigusr1: bool, round_: int = 0) -> dict:
    """This rank's position, read from its flight recorder (see the module docstring)."""
    now = time.perf_counter_ns()
    cur = trace.current()
    running = None
    if cur is not None:
        op, comm, seq, _nbytes, _alg, peer, t0 = cur[:7]
        running = [op, getattr(comm, "name", None), getattr(comm, "_cid", -1), seq, peer,
                   (now - t0) / 1e9]
    last = trace.last_completed()
    if last is not None:
        call, t1 = last
        last = [call[0], getattr(call[1], "name", None), getattr(call[1], "_cid", -1),
                call[2], (now - t1) / 1e9]
    failed = trace.last_failed()
    if failed is not None:
        call, t1, err = failed
        failed = [call[0], getattr(call[1], "name", None), getattr(call[1], "_cid", -1),
                  call[2], (now - t1) / 1e9, err.split(":", 1)[0]]
    return {"rank": rank, "pid": os.getpid(), "round": round_, "wall": time.time(),
            "running": running, "waiting_for": waiting_for, "last": last, "failed": failed,
            "comms": trace.collective_progress(), "sigs": trace.collective_signatures(),
            "sigusr1": sigusr1}


def _call_text(op: str, comm_name: str | None, seq: int, peer: int = -1) -> str:
    if op[:1].islower():
        return f"{trace.display_name(op)} #{seq} on {comm_name}"
    comm = _Named(comm_name) if comm_name is not None else None
    return trace.describe_call((op, comm, seq, 0, None, peer))


class _Named:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


def describe_position(pos: dict | None, rank: int, now_wall: float | None = None) -> str:
    """E.g. ``"rank 2 last completed Bcast #56 on pycomm.COMM_WORLD 12.4 s ago, and is in
    no pycomm call"``; for a rank that did not answer, its last answer, marked as such."""
    if pos is None:
        return f"rank {rank} did not answer (stopped, dead, or stuck outside Python)"
    now_wall = time.time() if now_wall is None else now_wall
    late = max(0.0, now_wall - pos["wall"])
    last = pos.get("last")
    text = f"rank {rank} "
    if last:
        op, cname, _cid, seq, ago = last
        text += f"last completed {_call_text(op, cname, seq)} {ago + late:.1f} s ago"
    else:
        text += "has completed no pycomm call"
    run = pos.get("running")
    if run:
        op, cname, _cid, seq, peer, secs = run
        text += f", and is in {_call_text(op, cname, seq, peer)} (for {secs + late:.1f} s"
        if pos.get("waiting_for") is not None:
            text += f", waiting for rank {pos['waiting_for']}"
        text += ")"
    else:
        text += ", and is in no pycomm call"
        failed = pos.get("failed")
        if failed:
            op, cname, _cid, seq, ago, kind = failed
            text += (f" (its {_call_text(op, cname, seq)} raised {kind} "
                     f"{ago + late:.1f} s ago)")
    if not pos.get("answered", True):
        text += f" [no answer now; this is its answer of {late:.1f} s ago]"
    return text


def diagnose(me: int, call, positions: dict) -> tuple[str, list[int]]:
    """Explain a stall of rank ``me`` in ``call`` (a flight-recorder entry) from the
    others' ``positions`` (world rank -> position or None). Returns (text, culprits):
    the world ranks that have not entered the collective, or the point-to-point peer."""
    op, comm, seq, _nbytes, _alg, peer = call[:6]
    cname, cid = getattr(comm, "name", "-"), getattr(comm, "_cid", -1)
    if op[:1].islower():                        # a collective: who has not entered it?
        members = list(getattr(comm, "_world", positions))
        missing = [m for m in members if m != me and
                   (positions.get(m) is None or positions[m].get("comms", {}).get(cid, 0) < seq)]
        label = "ranks" if cid == 0 else "world ranks"
        what = f"{trace.display_name(op)} #{seq} on {cname}"
        if not missing:
            waits = [f"rank {m} waits for rank {positions[m]['waiting_for']}"
                     for m in members if m != me and positions.get(m) is not None
                     and positions[m].get("waiting_for") is not None]
            return (f"every rank has entered {what}" +
                    (f" ({'; '.join(waits)})" if waits else ""), [])
        parts = [f"{label} {missing} have not called {what}"]
        parts += [describe_position(positions.get(m), m) for m in missing]
        return "; ".join(parts), missing
    if peer is None or peer < 0:
        return "", []
    return describe_position(positions.get(peer), peer), [peer]


def mismatch(me: int, call, positions: dict) -> str | None:
    """Why the collective ``call`` (a flight-recorder entry) of rank ``me`` can never
    complete, from the others' ``positions``: a member whose call of the same number on
    the same communicator has a signature that conflicts with this rank's
    (:func:`pycomm.signature.conflict`); None when no position proves it. (Such calls
    need not exchange a message that would show it: Bcast against Allreduce where every
    rank first receives, for one.)"""
    op, comm, seq = call[:3]
    eng, ctx = getattr(comm, "_engine", None), getattr(comm, "_cctx", None)
    if not op[:1].islower() or eng is None or ctx is None or ctx in eng.unordered:
        return None
    cur = eng.current.get(ctx)
    if cur is None or cur[0] != seq or cur[1] is None:
        return None
    mine = cur[1]
    # (here, not at import: the launcher imports this module and has no use for numpy)
    from .signature import conflict, describe
    for m in comm._world:
        theirs = (positions.get(m) or {}).get("sigs", {}).get(ctx) if m != me else None
        if theirs and theirs[0] == seq and conflict(mine, theirs[1:]):
            return (f"collective mismatch in call #{seq} on {comm.name}: rank "
                    f"{comm._from_world.get(m, m)} is in {describe(tuple(theirs[1:]))}, rank "
                    f"{comm.rank} in {describe(mine)} (found by asking the ranks)")
    return None


def summarize(positions: dict) -> tuple[str, list[int]]:
    """Explain where a group of ranks stands from their ``positions`` alone (the
    launcher's and the pool's view: no rank of their own). For every collective some ranks
    are in, or have just failed in, the ranks that have not entered it are the suspects.
    Returns (text, suspects); the text describes every rank not in such a collective."""
    calls: dict = {}
    for r, pos in sorted(positions.items()):
        for field, how in (("running", "in"), ("failed", "failed")):
            call = pos and pos.get(field)
            if call and call[0][:1].islower():
                calls.setdefault((call[2], call[3], call[0], call[1]), {}).setdefault(
                    how, []).append(r)
    parts, suspects, placed = [], [], set()
    for (cid, seq, op, cname), ranks in sorted(calls.items()):
        involved = ranks.get("in", []) + ranks.get("failed", [])
        placed.update(involved)
        missing = [r for r, pos in sorted(positions.items()) if r not in involved and
                   (pos is None or pos.get("comms", {}).get(cid, 0) < seq)]
        what = f"{trace.display_name(op)} #{seq} on {cname}"
        text = " and ".join(f"ranks {rs} {'are in' if how == 'in' else 'failed in'}"
                            for how, rs in ranks.items()) + f" {what}"
        if missing:
            text += f", which ranks {missing} have not called"
            suspects += [r for r in missing if r not in suspects]
        parts.append(text)
    parts += [describe_position(pos, r) for r, pos in sorted(positions.items())
              if r not in placed]
    return "; ".join(parts), sorted(suspects)


def ask_positions(client, job_id: str, ranks, wait_s: float = _ANSWER_S) -> dict:
    """Ask ``ranks`` for their positions through ``client`` (a StoreClient); wait up to
    ``wait_s`` seconds in all. Returns ``{rank: position or None}``; a rank that did not
    answer in time gets its last published position with ``answered`` False (None if it
    never published one: it has no pycomm world, or is gone).

    Raises:
        CommError: the store failed.
    """
    rounds = {}
    for r in ranks:
        k = client.add(key(job_id, "asks", r), 1)
        client.set(key(job_id, "ask", r, k), b"?")
        rounds[r] = k
    deadline = time.monotonic() + wait_s
    out: dict = {}
    for r, k in rounds.items():
        try:
            raw = client.get(key(job_id, "ans", r, k),
                             timeout=max(0.0, deadline - time.monotonic()))
            client.delete(key(job_id, "ans", r, k))
            out[r] = msgpack.unpackb(raw, raw=False, strict_map_key=False)
            continue
        except CommTimeoutError:
            pass
        try:
            old = msgpack.unpackb(client.get(key(job_id, "pos", r), timeout=0.0), raw=False,
                                  strict_map_key=False)
            old["answered"] = False
            out[r] = old
        except CommTimeoutError:
            out[r] = None
    return out


def read_positions(client, job_id: str, ranks) -> dict:
    """``{rank: position}`` last published by ``ranks`` (without asking them); a rank
    absent from the result never started a pycomm world with a store.

    Raises:
        CommError: the store failed.
    """
    out = {}
    for r in ranks:
        try:
            out[r] = msgpack.unpackb(client.get(key(job_id, "pos", r), timeout=0.0),
                                     raw=False, strict_map_key=False)
        except CommTimeoutError:
            pass
    return out


def read_diagnoses(client, job_id: str, ranks) -> dict:
    """``{rank: {"culprits": [...], "error": text}}`` of the ranks that published why
    they failed (the launcher's evidence).

    Raises:
        CommError: the store failed.
    """
    out = {}
    for r in ranks:
        try:
            out[r] = msgpack.unpackb(client.get(key(job_id, "diag", r), timeout=0.0),
                                     raw=False)
        except CommTimeoutError:
            pass
    return out


def read_exits(client, job_id: str, ranks) -> set[int]:
    """The ranks among ``ranks`` that published a deliberate exit (``exit/<r>``).

    Raises:
        CommError: the store failed.
    """
    out = set()
    for r in ranks:
        try:
            client.get(key(job_id, "exit", r), timeout=0.0)
            out.add(r)
        except CommTimeoutError:
            pass
    return out


def parse_abort(value: bytes | None) -> tuple[int, int] | None:
    """The ``(rank, code)`` of an ``abort`` note's value; None for no note."""
    if value is None:
        return None
    rank, code = msgpack.unpackb(value)
    return int(rank), int(code)


def read_abort(client, job_id: str) -> tuple[int, int] | None:
    """The job's abort note ``(rank, code)``, or None when no rank called ``Comm.Abort``.

    Raises:
        CommError: the store failed.
    """
    try:
        return parse_abort(client.get(key(job_id, "abort"), timeout=0.0))
    except CommTimeoutError:
        return None


class Inspector:
    """One rank's stall inspector: its responder thread and its side of the waits.

    Args:
        rank: world rank; size: world size; job_id: names the store keys.
        connect: returns a new StoreClient (one per thread: a client is not thread-safe).
        warn_s: ``PYCOMM_STALL_WARN``.
        sigusr1: whether SIGUSR1 prints this rank's flight recorder.
        client: a connected StoreClient the responder thread takes over (and closes), so
            that start-up pays no second handshake; None: it connects its own.
    """

    def __init__(self, rank: int, size: int, job_id: str, connect, warn_s: float,
                 sigusr1: bool, client=None):
        self.rank, self.size, self.job_id = rank, size, job_id
        self.warn_s = warn_s
        self.sigusr1 = sigusr1
        self.waiting_for: int | None = None
        self._connect = connect
        self._client = None             # the waiting threads' client, under _lock
        self._lock = threading.Lock()
        self._stopped = False
        self._handed = client
        self._thread = threading.Thread(target=self._respond, name="pycomm-stall-responder",
                                        daemon=True)
        # not waited for: start-up must not pay the responder's store handshake (it
        # publishes pos/<rank>, which the launcher looks for, a moment later)
        self._thread.start()
        trace._on_error = self.report_error

    # -- the responder thread ---------------------------------------------------------------
    def _respond(self) -> None:
        try:
            client = self._handed or self._connect()
        except CommError:
            return
        self._handed = None
        try:
            client.set(key(self.job_id, "pos", self.rank), self._position(0))
            k = 1
            while not self._stopped:
                try:
                    what = client.get(key(self.job_id, "ask", self.rank, k), timeout=_IDLE_S)
                except CommTimeoutError:
                    continue
                client.delete(key(self.job_id, "ask", self.rank, k))
                if what == b"!":
                    return
                pos = self._position(k)
                client.set(key(self.job_id, "pos", self.rank), pos)
                client.set(key(self.job_id, "ans", self.rank, k), pos)
                k += 1
        except CommError:
            pass                        # the store is gone: the job is ending
        finally:
            client.close()

    def _position(self, round_: int) -> bytes:
        # the program may have taken SIGUSR1 over since start-up: then nobody may send it
        sigusr1 = self.sigusr1 and signal.getsignal(signal.SIGUSR1) is trace.on_sigusr1
        return msgpack.packb(position(self.rank, self.waiting_for, sigusr1, round_))

    def close(self) -> None:
        """Stop the responder (it exits when it reads the stop key) and the client."""
        if self._stopped:
            return
        self._stopped = True
        if trace._on_error == self.report_error:
            trace._on_error = None
        with self._lock:
            try:
                client = self._get_client()
                k = client.add(key(self.job_id, "asks", self.rank), 1)
                client.set(key(self.job_id, "ask", self.rank, k), b"!")
            except CommError:
                pass
            if self._client is not None:
                self._client.close()
                self._client = None
        # it reads the stop key within a store round trip; joining keeps its socket from
        # outliving the interpreter's teardown
        self._thread.join(1.0)

    def _get_client(self):
        if self._client is None:
            self._client = self._connect()
        return self._client

    # -- the waiting side --------------------------------------------------------------------
    def inspect(self, peer: int | None, call=None, check: bool = False
                ) -> tuple[str, list[int]]:
        """Ask every other rank where it is; explain the stall of ``call`` (a flight
        recorder entry; default: the call this rank is in).

        Returns (text, culprits); ("", []) when this rank is in no recorded call or the
        store cannot be reached.

        Raises:
            CollectiveMismatchError: ``check`` and the positions prove that ``call`` is
                mismatched (:func:`mismatch`); its waits would last until the timeout.
        """
        call = trace.current() if call is None else call
        if call is None:
            return "", []
        self.waiting_for = peer
        others = [r for r in range(self.size) if r != self.rank]
        try:
            with self._lock:
                client = self._get_client()
                client.set(key(self.job_id, "pos", self.rank), self._position(-1))
                positions = ask_positions(client, self.job_id, others)
        except CommError:
            return "", []
        found = mismatch(self.rank, call, positions) if check else None
        if found is not None:
            self.waiting_for = None
            raise CollectiveMismatchError(f"rank {self.rank}: {found}")
        return diagnose(self.rank, call, positions)

    def report_error(self, exc: BaseException, call: str = "") -> None:
        """Publish whom ``exc`` (an error that left ``call``, described) blames, for the
        launcher."""
        culprits = getattr(exc, "culprits", None)
        if culprits is None and isinstance(exc, PeerError) and exc.peer is not None:
            culprits = [exc.peer]
        body = msgpack.packb({"culprits": list(culprits or []), "call": call,
                              "error": f"{type(exc).__name__}: {exc}"[:4000]})
        with self._lock:
            try:
                self._get_client().set(key(self.job_id, "diag", self.rank), body)
            except CommError:
                pass

    def report_abort(self, code: int) -> bool:
        """Publish that this rank calls ``Comm.Abort(code)`` (unless another rank did
        first); return whether the note is in the store, so that a launcher will stop the
        job. Waits at most 2 s for the lock and the store's default timeouts."""
        if not self._lock.acquire(timeout=2.0):
            return False
        try:
            client = self._get_client()
            if client.add(key(self.job_id, "abort#"), 1) == 1:
                client.set(key(self.job_id, "abort"), msgpack.packb([self.rank, code]))
            return True
        except CommError:
            return False
        finally:
            self._lock.release()

    def left_on_purpose(self, rank: int) -> bool:
        """Whether world rank ``rank`` published that it left with no uncaught exception
        (:meth:`report_exit`: a return or ``sys.exit``); False when the store cannot say.
        """
        if not self._lock.acquire(timeout=2.0):
            return False
        try:
            return bool(read_exits(self._get_client(), self.job_id, [rank]))
        except CommError:
            return False
        finally:
            self._lock.release()

    def report_exit(self) -> None:
        """Publish that this rank is leaving with no uncaught exception (a return, or
        ``sys.exit``/``SystemExit``): with a non-zero exit code the launcher then stops
        the others at once (see :func:`read_exits`)."""
        with self._lock:
            try:
                self._get_client().set(key(self.job_id, "exit", self.rank), b"exit")
            except CommError:
                pass
