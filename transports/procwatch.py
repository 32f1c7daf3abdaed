"""Process watch: whether a rank on another host runs, answered from outside that rank.

A host whose rank processes are stopped (``SIGSTOP``, a job-control stop) while its kernel
runs still acknowledges TCP data and keepalive probes, so neither keepalive nor
``TCP_USER_TIMEOUT`` (:mod:`transports.tcp`) ever fires, and a peer waiting for it would
wait out ``PYCOMM_TIMEOUT``. Asking the rank itself (a thread in it) cannot tell a stopped
process from a live one inside a C call that holds the GIL. The kernel can: field 3 of
``/proc/PID/stat`` is ``T`` for a stopped process and ``R``/``S``/``D`` for one that runs,
sleeps or waits for I/O, whatever its interpreter is doing.

So a rank of a TCP world that spans hosts starts a *watch* (:class:`Watch`): a small
process of its own session (a signal to the rank's process group does not reach it),
running this file as a script with the standard library only. It listens on a port
published with the rank's TCP address. An asker sends a question: a fresh random
challenge of :data:`NONCE_BYTES` bytes and its HMAC-SHA256 keyed with the job's token; the
watch checks it and answers at once with one line ``PID STATE STOPPED_S MAC`` — the rank's
pid, its state letter, for how many seconds it has been seen stopped (sampled every
:data:`TICK_S`), and the HMAC of the challenge and those fields — then closes the
connection. A question or an answer whose MAC does not verify gets nothing and means
nothing (as DESIGN.md asks of every TCP connection: nothing from a peer that has not
proved it holds the token is believed; the challenge makes an old answer useless).

The watch ends when the rank ends: its stdin is a pipe whose other end only the rank
holds, so the rank's exit, however it happens, is end-of-file here; it also ends when
``/proc/PID`` is gone.

A peer stalled on that rank asks through :class:`Asker`, without blocking its wait: a
non-blocking connect, read by later polls. What an answer means (see
:meth:`Asker.poll`):

* ``T`` for long enough: the rank is stopped; the peer reports it (a PeerError naming the
  rank and its host);
* any other state: the rank runs (maybe in user code, maybe in a long C call): wait on;
* a connection that completes but gets no line for as long: the watch itself does not
  run, so neither does anything else of the host's (all its processes stopped or frozen);
* no connection (refused, or no SYN-ACK): nothing is concluded. A pulled cable or a dead
  host kernel is the TCP connection's own business (keepalive, ``TCP_USER_TIMEOUT``), and a
  dead rank closes its sockets: reporting them here would race those clearer errors.

Known limits: a watch stopped on its own (its own session keeps job control and group
signals off it, so only a signal to its pid does it) reads to its peers as a host with
nothing running, and its rank, which then cannot tell its own stops, reports no peer; a
rank and watch starved by a CPU quota with a period near a second (``cpu.cfs_period_us``)
look stopped to themselves for part of each period, which delays or prevents their
reports of a stopped peer (the usual 100 ms period does not).

A tracing stop (``t``: a debugger holding the rank at a breakpoint) counts as running: a
user stepping through one rank expects the others to wait for it, as under MPI. So does a
rank that a tool such as cpulimit stops and continues many times a second: the watch
counts a stop as over whenever the kernel has scheduled the rank since the last sample
(``/proc/PID/schedstat``'s run count moved), whatever state each sample finds.

Only stops that the asking rank was awake for count (see :meth:`Asker.poll` and
:meth:`Watch.stopped_at`): a whole job stopped and continued (Slurm's ``scontrol
suspend``/``resume``, which reaches the hosts one after the other) finds every peer stopped
for as long as itself, and that is no failure.
"""

from __future__ import annotations

import errno
import hmac
import mmap
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time

__all__ = ["Asker", "BACKLOG", "TICK_S", "Watch", "process_state"]

TICK_S = 0.25       # the most seconds between two samples of the rank's state
_SELF_STOPPED_S = 1.0   # a turn of the watch's loop this long: the watch was stopped
_WORDS = struct.Struct("dd")    # shared with the rank: [last stopped, last loop turn]
_LINE_MAX = 128
NONCE_BYTES = 16   # the asker's challenge
_QUESTION_BYTES = NONCE_BYTES + 64  # the challenge and its MAC (hex)
_KEY_ENV = "PYCOMM_WATCH_KEY"    # how the watch gets the token (hex): not on its command line
_QUESTION_S = 10.0  # a connection whose challenge has not come by then is closed
BACKLOG = 1024     # questions the kernel queues (many peers may ask at once)


def process_state(pid: int) -> str | None:
    """The scheduler state letter of process ``pid`` (``/proc/PID/stat`` field 3), or None
    if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # the name (field 2) is in parentheses and may hold spaces or ')': split after the last
    return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3].decode()


def _runs(pid: int) -> str | None:
    """How many times the kernel has put ``pid``'s main thread on a CPU (it moves on every
    stop and continue too; ``/proc/PID/schedstat``), as text; None where the kernel does not
    say (then a sample in state ``T`` alone counts, as it would without this)."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return f.read().split()[2].decode()
    except (OSError, IndexError):
        return None


class Watch:
    """This rank's watch (a process, see the module docstring), and what it has seen of
    this rank's own stops.

    The watch shares two words with the rank (a ``memfd``), both ``time.monotonic()``
    values: when it last found the rank stopped for a whole tick (stopped at two samples,
    not scheduled in between: a rank throttled cpulimit's way is not stopped), or found
    itself stopped (a turn of its loop far longer than its tick: the host, or the whole job
    with it, was); and when its loop last turned. A rank that asks about its peers counts
    their stops only from the first (:meth:`stopped_at`), so a job suspended and resumed
    host by host is no failure, and a rank merely slow to turn its own waiting loop (a C
    call holding the GIL) still counts them. A rank that runs again before its watch
    does (resumed first, or the watch not yet scheduled) finds the second word old: it
    cannot know, and counts from now.

    Args:
        listener: a bound socket; the watch gets its own copy (close yours) and listens.
        key: the job's token, which its answers prove they come from.
        pid: the process to watch (default: this one).
        tick: seconds between two samples of its state (at most :data:`TICK_S`).

    Raises:
        OSError: the watch could not be started.
    """

    def __init__(self, listener: socket.socket, key: bytes, pid: int | None = None,
                 tick: float = TICK_S):
        pid = os.getpid() if pid is None else pid
        listener.listen(BACKLOG)
        lfd = listener.fileno()
        wfd = os.memfd_create("pycomm-watch", os.MFD_CLOEXEC)
        try:
            os.ftruncate(wfd, _WORDS.size)
            self._word = mmap.mmap(wfd, _WORDS.size)
            # its stdin: a pipe whose write end only this process holds, so the rank's
            # exit, however it happens, ends the watch within a tick
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(lfd), str(pid),
                 repr(min(tick, TICK_S)), str(wfd)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(lfd, wfd), start_new_session=True, close_fds=True,
                env={**os.environ, _KEY_ENV: key.hex()})
        finally:
            os.close(wfd)
        self.tick = min(tick, TICK_S)

    def stopped_at(self) -> float:
        """``time.monotonic()`` when the watch last saw this rank (or itself) stopped, plus
        a tick (it may have resumed up to a tick before the next sample); 0.0 if never;
        now if the watch's loop has not turned for :data:`_SELF_STOPPED_S` (it has not run
        since, so it cannot tell), or if the watch is gone."""
        if self._word.closed or self.process.poll() is not None:
            return time.monotonic()
        stopped, turned = _WORDS.unpack_from(self._word)
        now = time.monotonic()
        if now - turned > _SELF_STOPPED_S:
            return now
        return stopped + self.tick if stopped else 0.0

    def stop(self) -> None:
        """End the watch at once, and reap it."""
        proc = self.process
        try:
            proc.stdin.close()
        except OSError:
            pass
        proc.terminate()        # at once: a forked child of the rank may hold the pipe open
        try:
            os.kill(proc.pid, signal.SIGCONT)   # a stopped watch acts on it only once continued
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:                # (SIGKILL ends it unless the kernel holds it: do not hang)
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
        self._word.close()


def _mac(key: bytes, nonce: bytes, fields: bytes) -> bytes:
    return hmac.new(key, nonce + fields, "sha256").hexdigest().encode()


def question(key: bytes, nonce: bytes) -> bytes:
    """What an asker sends: challenge ``nonce`` and its MAC (see the module docstring)."""
    return nonce + _mac(key, b"?", nonce)


def answer(key: bytes, nonce: bytes, pid: int, state: str, stopped: float) -> bytes:
    """The watch's line for challenge ``nonce`` (see the module docstring)."""
    fields = f"{pid} {state} {stopped:.3f}".encode()
    return fields + b" " + _mac(key, nonce, fields) + b"\n"


def _serve(fd: int, pid: int, tick: float, word_fd: int) -> None:
    """The watch's loop (the script's body): sample, answer, end with the rank."""
    key = bytes.fromhex(os.environ.pop(_KEY_ENV, ""))
    listener = socket.socket(fileno=fd)
    listener.setblocking(False)
    word = mmap.mmap(word_fd, _WORDS.size)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "connection")
    sel.register(0, selectors.EVENT_READ, "rank")
    questions: dict[socket.socket, list] = {}      # connection -> [challenge so far, since]
    stopped_since = None
    runs = None
    stopped_at = 0.0
    last = time.monotonic()

    listening = [True]      # the listener is in the selector (not while BACKLOG wait)

    def close(conn: socket.socket) -> None:
        sel.unregister(conn)
        del questions[conn]
        conn.close()
        if not listening[0]:
            sel.register(listener, selectors.EVENT_READ, "connection")
            listening[0] = True

    while True:
        state = process_state(pid)
        if state is None:
            return
        now = time.monotonic()
        ran, runs = runs, _runs(pid)
        if state != "T" or ran != runs:     # running, or ran since the last sample
            stopped_since = None if state != "T" else now
        elif stopped_since is None:
            stopped_since = now
        # the rank stopped for a whole tick, or this watch was stopped itself
        if state == "T" and ran == runs or now - last > _SELF_STOPPED_S:
            stopped_at = now
        _WORDS.pack_into(word, 0, stopped_at, now)
        last = now
        for conn in [c for c, q in questions.items() if now - q[1] > _QUESTION_S]:
            close(conn)
        for sel_key, _ in sel.select(tick):
            if sel_key.data == "rank":
                if not os.read(0, 4096):
                    return                      # the rank closed the pipe or exited
            elif sel_key.data == "connection":
                while len(questions) < BACKLOG:
                    try:
                        conn, _ = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:             # e.g. out of descriptors: answer later,
                        time.sleep(tick)        # without spinning on the readable listener
                        break
                    conn.setblocking(False)
                    questions[conn] = [b"", time.monotonic()]
                    sel.register(conn, selectors.EVENT_READ, "question")
                if len(questions) >= BACKLOG:
                    # the listener stays readable while the kernel queues more: out of the
                    # selector until a question is done, or the loop would spin on it
                    sel.unregister(listener)
                    listening[0] = False
            else:
                conn = sel_key.fileobj
                q = questions[conn]
                try:
                    got = conn.recv(_QUESTION_BYTES - len(q[0]))
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    got = b""
                q[0] += got
                nonce = q[0][:NONCE_BYTES]
                if len(q[0]) == _QUESTION_BYTES and \
                        hmac.compare_digest(q[0], question(key, nonce)):
                    state = process_state(pid) or "X"
                    stopped = 0.0 if state != "T" else \
                        time.monotonic() - (stopped_since or time.monotonic())
                    try:
                        conn.send(answer(key, nonce, pid, state, stopped))
                    except OSError:
                        pass
                if not got or len(q[0]) == _QUESTION_BYTES:
                    close(conn)


class Asker:
    """Questions to the watches of a rank's peers, asked and read without blocking.

    Args:
        addresses: peer -> (host, port) of its watch.
        patience: seconds a peer must have been stopped (or its watch silent), while the
            asking rank was awake, before it is reported: half ``PYCOMM_PEER_TIMEOUT``.
        key: the job's token: an answer is believed only with its MAC (module docstring).
    """

    def __init__(self, addresses: dict[int, tuple[str, int]], patience: float, key: bytes):
        self.addresses = addresses
        self.patience = patience
        self.key = key
        # peer -> [socket, started, connected, challenge]
        self._asks: dict[int, list] = {}
        self._next: dict[int, float] = {}   # peer -> when to ask it again

    def poll(self, peers, awake_since: float) -> tuple[int, str] | None:
        """Ask the watches of ``peers`` (when due) and read their answers in.

        ``awake_since`` (``time.monotonic()``) is when the asking rank's wait began, or
        later, when it last found itself stopped: questions asked before it are dropped
        unread (their answers describe another wait, or a time the asker slept through),
        and a peer's stop counts only from it.

        Returns ``(peer, why)`` for the first peer of ``peers`` that has not run for
        ``patience`` seconds of that time — stopped by the kernel's account, or its watch
        silent on an open connection — else None. Never blocks.
        """
        now = time.monotonic()
        wanted = set(peers)
        for peer, ask in list(self._asks.items()):
            if peer not in wanted or ask[1] < awake_since:
                self._drop(peer)
        for peer in wanted:
            if peer in self.addresses and peer not in self._asks and \
                    now >= self._next.get(peer, 0.0):
                self._ask(peer, now)
        found = None
        for peer, ask in list(self._asks.items()):
            why = self._read(peer, ask, now, now - awake_since)
            if why is not None and found is None:
                found = (peer, why)
        return found

    def _ask(self, peer: int, now: float) -> None:
        self._next[peer] = now + self.patience / 4
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        except OSError:                         # out of descriptors: ask later
            return
        sock.setblocking(False)
        err = sock.connect_ex(self.addresses[peer])
        if err not in (0, errno.EINPROGRESS):
            sock.close()                        # refused: the watch is gone; nothing known
            return
        ask = self._asks[peer] = [sock, now, False, os.urandom(NONCE_BYTES)]
        if err == 0:
            self._connected(peer, ask)

    def _connected(self, peer: int, ask: list) -> bool:
        """Send the question on the connection just made (80 bytes: they fit a fresh
        socket's buffer); False (and the question dropped) if that fails."""
        try:
            ask[0].send(question(self.key, ask[3]))
        except OSError:
            self._drop(peer)
            return False
        ask[2] = True
        return True

    def _read(self, peer: int, ask: list, now: float, awake_s: float) -> str | None:
        sock, started, connected, nonce = ask
        if not connected:
            try:
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err == 0 and sock.getpeername():
                    if not self._connected(peer, ask):
                        return None
                    connected = True
            except OSError:
                err = errno.ENOTCONN            # still connecting
            if err not in (0, errno.ENOTCONN):
                return self._drop(peer)         # refused or unreachable: nothing known
        if connected:
            try:
                line = sock.recv(_LINE_MAX)
            except (BlockingIOError, InterruptedError):
                line = None
            except OSError:
                return self._drop(peer)
            if line is not None:
                self._drop(peer)
                return self._verdict(peer, line, nonce, now, awake_s)
            if now - started >= self.patience:
                self._drop(peer)
                return (f"its watch accepted a question {now - started:.1f} s ago and has "
                        "not answered: no process of its host runs (all stopped or frozen)")
        elif now - started >= self.patience / 2:
            return self._drop(peer)             # no SYN-ACK: the link's business
        return None

    def _verdict(self, peer: int, line: bytes, nonce: bytes, now: float,
                 awake_s: float) -> str | None:
        fields, _, mac = line.rstrip(b"\n").rpartition(b" ")
        if not hmac.compare_digest(mac, _mac(self.key, nonce, fields)):
            return None                 # not the watch's (no token), or not to this question
        try:
            pid, state, stopped = fields.decode().split()
            stopped_s = float(stopped)
        except ValueError:
            return None
        if state == "T":
            counted = min(stopped_s, awake_s)
            if counted >= self.patience:
                return (f"its process (pid {pid}) has been stopped for {stopped_s:.1f} s "
                        "(SIGSTOP or a job-control stop)")
            # ask again once it would have been stopped long enough
            self._next[peer] = now + self.patience - counted + TICK_S
        return None

    def _drop(self, peer: int) -> None:
        ask = self._asks.pop(peer, None)
        if ask is not None:
            ask[0].close()
        return None

    def close(self) -> None:
        for peer in list(self._asks):
            self._drop(peer)


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
