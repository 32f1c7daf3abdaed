"""The process watch (transports/procwatch.py): what it answers about a stopped, a running
and a busy process, a watch that does not run, and that it never outlives its process.

The multi-host case (a host's ranks SIGSTOPped mid-job -> PeerError on the other host)
is in tests/test_cluster.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from transports import procwatch

PATIENCE = 0.6
KEY = b"job token"


def _listener() -> socket.socket:
    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lst.bind(("127.0.0.1", 0))
    lst.listen(16)
    return lst


class _Watched:
    """A child process (``code`` in Python), its watch, and an Asker for it as peer 7."""

    def __init__(self, code: str, patience: float = PATIENCE):
        self.proc = subprocess.Popen([sys.executable, "-c", code])
        lst = _listener()
        self.addr = lst.getsockname()
        self.watch = procwatch.Watch(lst, KEY, self.proc.pid)
        lst.close()
        self.asker = procwatch.Asker({7: self.addr}, patience, KEY)

    def verdict_within(self, seconds: float, awake_since: float | None = None, peers=(7,)):
        """The first non-None poll within ``seconds`` (None if there was none), polling as
        a wait that began (or whose rank last woke) at ``awake_since`` (default: now)."""
        now = time.monotonic()
        awake_since = now if awake_since is None else awake_since
        end = now + seconds
        while time.monotonic() < end:
            found = self.asker.poll(list(peers), awake_since)
            if found is not None:
                return found
            time.sleep(0.05)
        return None

    def close(self) -> None:
        self.asker.close()
        for sig in (signal.SIGCONT, signal.SIGKILL):
            for pid in (self.proc.pid, self.watch.process.pid):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        self.proc.wait(timeout=10)
        self.watch.stop()


@pytest.fixture
def sleeper():
    w = _Watched("import time; time.sleep(120)")
    yield w
    w.close()


def test_process_state_reads_the_kernels_letter():
    assert procwatch.process_state(os.getpid()) == "R"
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while procwatch.process_state(p.pid) != "S" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert procwatch.process_state(p.pid) == "S"
        os.kill(p.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while procwatch.process_state(p.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procwatch.process_state(p.pid) == "T"
    finally:
        p.kill()
        p.wait()
    assert procwatch.process_state(p.pid) is None


def test_a_stopped_process_is_reported_after_the_patience_and_not_before(sleeper):
    assert sleeper.verdict_within(1.0) is None          # sleeping: runs
    os.kill(sleeper.proc.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    found = sleeper.verdict_within(5.0)
    took = time.monotonic() - t0
    assert found is not None, "a process stopped for 5 s was not reported"
    peer, why = found
    assert peer == 7
    assert f"its process (pid {sleeper.proc.pid}) has been stopped for " in why, why
    assert "(SIGSTOP or a job-control stop)" in why, why
    # not before it was stopped for the patience; asked again every half of it
    assert PATIENCE <= took < PATIENCE * 2 + 1.0, took
    os.kill(sleeper.proc.pid, signal.SIGCONT)
    time.sleep(2 * procwatch.TICK_S)
    assert sleeper.verdict_within(1.5) is None          # resumed: runs again


# -- quiet windows: nothing may be reported for a few seconds --------------------------------
# Each of these watches (or asks) for a while and expects no verdict, with no bound on when
# something happens; each has its own process, watch, fake watch and asker. A module
# fixture runs them at once (their seconds are waiting) and each test checks its own.

def _busy_verdict():
    # sum() over a range is one C call: the GIL is held for its whole length. Patience
    # 1.5 s: under the whole suite's load (2 cores, Open MPI's and Slurm's tests running
    # too) the watch, a process of its own, once took more than 0.6 s to answer.
    w = _Watched("while True: sum(range(10**8))", patience=1.5)
    try:
        return w.verdict_within(2.5)
    finally:
        w.close()


def _no_watch_verdicts() -> list:
    """Every non-None poll of 1.5 s of asking peers 3 (refused: its watch is gone) and 4
    (no watch at all)."""
    lst = _listener()
    addr = lst.getsockname()
    lst.close()                                         # refused from now on
    asker = procwatch.Asker({3: addr}, PATIENCE, KEY)
    t0 = time.monotonic()
    end = t0 + 1.5
    found = []
    while time.monotonic() < end:
        got = asker.poll([3, 4], t0)                    # 4 has no watch at all
        if got is not None:
            found.append(got)
        time.sleep(0.05)
    asker.close()
    return found


def _forged_verdict(forgery: str):
    """What an asker concludes from a watch's port that answers with ``forgery``."""
    def reply(nonce):
        if forgery == "no key":
            return b"4242 T 999.000 " + b"0" * 64 + b"\n"
        if forgery == "another question's answer":
            return procwatch.answer(KEY, bytes(procwatch.NONCE_BYTES), 4242, "T", 999.0)
        return procwatch.answer(KEY, nonce, 4242, "T", 999.0)
    return _FakeWatch(reply).verdict_within(4 * PATIENCE)


FORGERIES = ["no key", "another question's answer", "the key"]


@pytest.fixture(scope="module")
def quiet_windows() -> dict:
    """Every quiet window at once: key -> a Future of its outcome."""
    jobs = {"busy": (_busy_verdict,), "no watch": (_no_watch_verdicts,),
            **{f: (_forged_verdict, f) for f in FORGERIES}}
    with ThreadPoolExecutor(len(jobs)) as pool:
        return {key: pool.submit(*job) for key, job in jobs.items()}


def test_a_process_busy_on_its_cpu_holding_its_gil_runs(quiet_windows):
    assert quiet_windows["busy"].result() is None


def test_a_watch_that_accepts_but_never_answers_means_nothing_on_the_host_runs(sleeper):
    os.kill(sleeper.watch.process.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    found = sleeper.verdict_within(5.0)
    assert found is not None
    assert "its watch accepted a question" in found[1], found
    assert "no process of its host runs" in found[1], found
    assert time.monotonic() - t0 >= PATIENCE


def test_no_watch_listening_is_no_verdict_and_no_error(quiet_windows):
    assert quiet_windows["no watch"].result() == []     # every poll None, none raised


class _FakeWatch:
    """A server on a watch's port that answers every question with ``reply(nonce)``."""

    def __init__(self, reply):
        self.lst = _listener()
        self.addr = self.lst.getsockname()
        self.reply = reply
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.lst.accept()
            except OSError:
                return
            with conn:
                got = b""
                while len(got) < procwatch.NONCE_BYTES + 64:
                    more = conn.recv(256)
                    if not more:
                        break
                    got += more
                conn.sendall(self.reply(got[:procwatch.NONCE_BYTES]))

    def verdict_within(self, seconds: float):
        asker = procwatch.Asker({5: self.addr}, PATIENCE, KEY)
        t0 = time.monotonic()
        try:
            while time.monotonic() < t0 + seconds:
                found = asker.poll([5], t0 - 10.0)      # awake long before: any stop counts
                if found is not None:
                    return found
                time.sleep(0.05)
            return None
        finally:
            asker.close()
            self.lst.close()


@pytest.mark.parametrize("forgery", FORGERIES)
def test_an_answer_counts_only_with_its_mac_for_this_question(quiet_windows, forgery):
    """A stranger on a watch's port (or a recorded answer replayed) cannot make a rank
    report its peer stopped; the same answer with the right MAC does (the control)."""
    found = quiet_windows[forgery].result()
    if forgery == "the key":
        assert found is not None and "pid 4242" in found[1], found
    else:
        assert found is None, found


def test_a_question_without_the_key_gets_no_answer(sleeper):
    with socket.create_connection(sleeper.addr, timeout=10) as s:
        s.sendall(os.urandom(procwatch.NONCE_BYTES) + b"0" * 64)
        assert s.recv(256) == b""                       # closed unanswered
    with socket.create_connection(sleeper.addr, timeout=10) as s:   # the same, keyed
        s.sendall(procwatch.question(KEY, bytes(procwatch.NONCE_BYTES)))
        pid, state = s.recv(256).split()[:2]
        assert int(pid) == sleeper.proc.pid and state in (b"R", b"S")


def test_out_of_descriptors_is_no_verdict_and_no_error(sleeper, monkeypatch):
    def no_socket(*args, **kwargs):
        raise OSError(24, "Too many open files")
    monkeypatch.setattr(procwatch.socket, "socket", no_socket)
    os.kill(sleeper.proc.pid, signal.SIGSTOP)
    assert sleeper.verdict_within(2 * PATIENCE) is None


def test_an_answer_to_an_earlier_wait_is_not_judged_in_a_later_one(sleeper):
    """The peer is stopped while one wait asks (not yet for the patience), then continued;
    a later wait, even one that needs no peer, must not judge the earlier answer."""
    os.kill(sleeper.proc.pid, signal.SIGSTOP)
    assert sleeper.verdict_within(PATIENCE / 2) is None
    os.kill(sleeper.proc.pid, signal.SIGCONT)
    time.sleep(PATIENCE * 2)
    assert sleeper.verdict_within(0.3, peers=()) is None
    assert sleeper.verdict_within(PATIENCE * 2) is None


def test_a_peer_stopped_only_while_the_asker_slept_too_is_waited_for(sleeper):
    """A whole job suspended and continued host by host: the asker wakes to find its peer
    stopped for long, but counts only the time it has been awake itself, and the peer
    continues within the patience."""
    os.kill(sleeper.proc.pid, signal.SIGSTOP)
    time.sleep(PATIENCE * 3)                            # both "stopped"; the asker wakes:
    woke = time.monotonic()
    assert sleeper.verdict_within(PATIENCE / 2, awake_since=woke) is None
    os.kill(sleeper.proc.pid, signal.SIGCONT)           # the peer's host continues too
    assert sleeper.verdict_within(PATIENCE * 2, awake_since=woke) is None
    # and had it not continued, the asker's own patience decides
    os.kill(sleeper.proc.pid, signal.SIGSTOP)
    found = sleeper.verdict_within(PATIENCE * 4)
    assert found is not None and "has been stopped for" in found[1], found


def test_a_rank_stopped_and_continued_many_times_a_second_runs():
    """cpulimit's way of throttling: stopped 90% of the time, in 0.1 s periods. The kernel
    schedules it between stops, so no stop lasts the patience."""
    w = _Watched("while True: sum(range(10**5))")
    try:
        t0 = time.monotonic()
        end = t0 + 3.0
        while time.monotonic() < end:
            os.kill(w.proc.pid, signal.SIGSTOP)
            time.sleep(0.09)
            os.kill(w.proc.pid, signal.SIGCONT)
            time.sleep(0.01)
            assert w.asker.poll([7], t0) is None
    finally:
        w.close()


def test_the_watch_ends_with_its_process_and_when_told():
    w = _Watched("import time; time.sleep(120)")
    try:
        w.proc.kill()
        w.proc.wait()
        assert w.watch.process.wait(timeout=3) == 0     # /proc/PID is gone
    finally:
        w.close()
    # stop(): the watch ends at once (its process still running), even while a child of
    # the rank (a forked worker) holds the pipe's write end open
    w = _Watched("import time; time.sleep(120)")
    child = subprocess.Popen(["sleep", "30"], pass_fds=(w.watch.process.stdin.fileno(),))
    try:
        t0 = time.monotonic()
        w.watch.stop()
        assert time.monotonic() - t0 < 0.5
        rc = w.watch.process.returncode
        assert rc is not None and rc != -signal.SIGKILL
        assert w.proc.poll() is None
    finally:
        child.kill()
        child.wait()
        w.close()


def test_the_watch_ends_when_the_rank_holding_its_pipe_is_killed():
    """The watched process is the watch's parent (as for a rank): SIGKILL closes the pipe."""
    code = ("import socket, sys, time; sys.path.insert(0, %r); from transports import "
            "procwatch; s = socket.socket(); s.bind(('127.0.0.1', 0)); "
            "w = procwatch.Watch(s, b'k'); print(w.process.pid, flush=True); time.sleep(120)"
            % os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rank = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        watch_pid = int(rank.stdout.readline())
        assert procwatch.process_state(watch_pid) in ("S", "R")
        rank.kill()
        rank.wait()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            state = procwatch.process_state(watch_pid)
            if state in (None, "Z"):
                break
            time.sleep(0.05)
        assert procwatch.process_state(watch_pid) in (None, "Z")
    finally:
        rank.kill()
        rank.wait()


def test_the_watch_tells_its_rank_when_it_or_its_host_was_last_stopped(sleeper):
    """The word a rank reads (Watch.stopped_at): 0 while nothing was stopped; about the
    resume once its process was stopped; and about the resume once the watch itself was
    stopped (its host, or the whole job with it, was)."""
    time.sleep(2 * procwatch.TICK_S)
    assert sleeper.watch.stopped_at() == 0.0
    os.kill(sleeper.proc.pid, signal.SIGSTOP)
    time.sleep(0.8)
    os.kill(sleeper.proc.pid, signal.SIGCONT)
    resumed = time.monotonic()
    time.sleep(2 * procwatch.TICK_S)
    at = sleeper.watch.stopped_at()
    assert resumed - procwatch.TICK_S <= at <= resumed + 2 * procwatch.TICK_S, (at, resumed)
    os.kill(sleeper.watch.process.pid, signal.SIGSTOP)
    time.sleep(1.5)
    # the watch has not turned for over a second: it cannot tell, so "now"
    assert abs(sleeper.watch.stopped_at() - time.monotonic()) < 0.1
    os.kill(sleeper.watch.process.pid, signal.SIGCONT)
    resumed = time.monotonic()
    # A loaded machine may run the resumed watch late, and the word is when it noticed:
    # so the bound is "after the resume and well before now", not a fixed delay.
    time.sleep(4 * procwatch.TICK_S)
    at, read = sleeper.watch.stopped_at(), time.monotonic()
    assert resumed - procwatch.TICK_S <= at <= read - procwatch.TICK_S, (at, resumed, read)
    os.kill(sleeper.watch.process.pid, signal.SIGSTOP)  # stop() ends a stopped watch too
    t0 = time.monotonic()
    sleeper.watch.stop()
    assert time.monotonic() - t0 < 0.5 and sleeper.watch.process.returncode == -signal.SIGTERM
    assert abs(sleeper.watch.stopped_at() - time.monotonic()) < 0.1


def test_a_watch_that_is_gone_cannot_tell(sleeper):
    sleeper.watch.process.kill()
    sleeper.watch.process.wait()
    assert abs(sleeper.watch.stopped_at() - time.monotonic()) < 0.1


def test_a_rank_throttled_cpulimit_style_is_not_stopped_for_its_own_count():
    w = _Watched("while True: sum(range(10**5))")
    try:
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            os.kill(w.proc.pid, signal.SIGSTOP)
            time.sleep(0.03)
            os.kill(w.proc.pid, signal.SIGCONT)
            time.sleep(0.07)
        assert w.watch.stopped_at() == 0.0
    finally:
        w.close()


def test_a_silent_stranger_does_not_hold_up_the_answers(sleeper):
    """A connection that never sends its question waits (until _QUESTION_S) beside the
    others: a keyed question asked meanwhile is answered at once."""
    with socket.create_connection(sleeper.addr, timeout=10):        # says nothing
        with socket.create_connection(sleeper.addr, timeout=10) as s:
            s.sendall(procwatch.question(KEY, bytes(procwatch.NONCE_BYTES)))
            t0 = time.monotonic()
            pid, _state = s.recv(256).split()[:2]
            assert int(pid) == sleeper.proc.pid
            assert time.monotonic() - t0 < procwatch._QUESTION_S / 2


def test_a_full_backlog_of_silent_connections_costs_the_watch_no_cpu(sleeper):
    """With BACKLOG connections that never ask and one more queued by the kernel, the
    watch stops accepting until one is done, without spinning on its listener (readable
    while the queued one waits); then it takes the queued one and answers its question."""
    silent = [socket.create_connection(sleeper.addr, timeout=10)
              for _ in range(procwatch.BACKLOG)]
    try:
        time.sleep(0.5)                      # the watch accepts them all
        with socket.create_connection(sleeper.addr, timeout=10) as s:  # queued
            s.sendall(procwatch.question(KEY, bytes(procwatch.NONCE_BYTES)))
            watch = psutil.Process(sleeper.watch.process.pid)
            before = sum(watch.cpu_times()[:2])
            time.sleep(1.5)
            # a spinning loop takes most of the 1.5 s; sampling takes a few ms per tick
            assert sum(watch.cpu_times()[:2]) - before < 0.3
            silent.pop().close()             # one is done: the watch accepts again
            pid, _state = s.recv(256).split()[:2]
            assert int(pid) == sleeper.proc.pid
    finally:
        for conn in silent:
            conn.close()
