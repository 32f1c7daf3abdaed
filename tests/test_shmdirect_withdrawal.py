"""Direct reads of the peers' buffers (pycomm.shmdirect) in launched jobs, beside
test_shmdirect.py's shared worlds:

* without cross-memory attach (PYCOMM_CMA=0) the call sends messages, with the right sum;
* a rank whose call fails withdraws its buffers, and a descheduled peer that reads them
  after they were reused raises (or returns the right result, never the reused bytes), in
  an all-reduce, a reduce-scatter, an all-gather and a broadcast, on 2 and 3 ranks;
* on two ranks the broadcast's root writes into its peer's buffer: a peer whose call fails
  while that write is in flight returns only after it, so the buffer it then reuses keeps
  its new bytes; a root held up past the grace writes nothing once the peer has withdrawn,
  and the peer's error says the buffer may still be written.

Every job of this module is started at once (the ``launched`` fixture).
"""

from __future__ import annotations

import textwrap

import pytest

from conftest import run_at_once
from test_shmcoll_jobs import _launch_job
from pycomm.shmdirect import SHM_DIRECT


# The jobs' ranks meet through files in the job's folder: wait_for(name, ...) waits (at
# most 30 s) until every one exists.
_WAIT_FOR = """\
import os, time


def wait_for(*names):
    t = time.monotonic()
    while not all(os.path.exists(f) for f in names) and time.monotonic() - t < 30:
        time.sleep(0.01)

"""


# The waits that time out in these jobs: 1.5 s from init on (the engine's default wait,
# PYCOMM_TIMEOUT's), while start-up keeps the launcher's 60 s: the module's jobs start at
# once, and under load a rank can take longer than 1.5 s to start.
WAITS_1_5_S = {"WAIT_S": "1.5"}


def _launched_jobs() -> dict:
    """The launched jobs of this module: key -> (program, ranks, environment)."""
    def job(program, n, env):
        return _WAIT_FOR + textwrap.dedent(program), n, env
    jobs = {"no-cma": job(_NO_CMA, 2, {"PYCOMM_CMA": "0"}),
            ("withdrawal", "allreduce", 2): job(_WITHDRAWAL_ALLREDUCE, 2,
                                                WAITS_1_5_S)}
    for collective in ("reduce_scatter_block", "allgather", "bcast"):
        for n in (2, 3):
            jobs["withdrawal", collective, n] = job(_WITHDRAWAL.format(collective=collective),
                                                    n, WAITS_1_5_S)
    for case in ("in-flight", "late"):
        jobs["root writes", case] = job(_ROOT_WRITES.format(case=case), 2,
                                        WAITS_1_5_S)
    return jobs


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict:
    """Every launched job of this module, started at once (their seconds go to timeouts
    and to ranks waiting for each other's files): key -> CompletedProcess."""
    jobs = {key: _launch_job(tmp_path_factory.mktemp("job"), *job)
            for key, job in _launched_jobs().items()}
    done = run_at_once(jobs, tmp_path_factory.mktemp("out"), timeout=120)
    return {key: proc for key, (proc, _) in done.items()}


_NO_CMA = """
        import numpy as np, pycomm
        comm = pycomm.init()
        x = np.full(1 << 18, comm.rank + 1.0)
        comm.Allreduce(pycomm.IN_PLACE, x)
        print("CHOSEN", comm.chosen_algorithm("allreduce", x.nbytes), x[0], x[-1], flush=True)
        """


def test_without_cross_memory_attach_the_call_sends_messages(launched):
    # (a peer dying inside a direct call: test_shmcoll.py's slot-wait death test)
    proc = launched["no-cma"]
    lines = [ln for ln in proc.stdout.splitlines() if "CHOSEN" in ln]
    assert proc.returncode == 0 and len(lines) == 2, proc.stdout + proc.stderr
    for ln in lines:
        name, first, last = ln.split("CHOSEN", 1)[1].split()
        assert name != SHM_DIRECT and float(first) == float(last) == 3.0, ln


_WITHDRAWAL_ALLREDUCE = """
        import os, time, numpy as np, pycomm
        from pycomm import shmdirect
        comm = pycomm.init()
        comm._engine.timeout = float(os.environ["WAIT_S"])
        r = comm.rank
        x = np.full(1 << 16, r + 1.0)
        assert comm.chosen_algorithm("allreduce", x.nbytes) == "shm_direct"
        comm.Barrier()

        if r == 1:
            step, read = shmdirect._Reads.step, shmdirect._Reads.read
            state = {"gather": False, "slept": False}
            def slow_step(self, cc, w, n, last=3):
                step(self, cc, w, n, last)
                state["gather"] = n == 2
            def slow_read(self, *args):
                if state["gather"] and not state["slept"]:
                    state["slept"] = True
                    wait_for("reused-0")        # until rank 0 failed and reused x
                return read(self, *args)
            shmdirect._Reads.step, shmdirect._Reads.read = slow_step, slow_read
        try:
            comm.Allreduce(pycomm.IN_PLACE, x)
            print("RESULT", r, "ok", x[0], x[-1], flush=True)
        except pycomm.CommError as exc:
            x[...] = -1.0                   # the user reuses its buffer at once
            print("RESULT", r, type(exc).__name__, flush=True)
        if r == 0:
            open("reused-0", "w").close()
            wait_for("done-1")              # alive while rank 1 reads (else: ESRCH)
        else:
            open("done-1", "w").close()
        """


def test_a_rank_that_fails_withdraws_its_buffer_before_a_slow_peer_reads_it(launched):
    # rank 1 is descheduled in the all-gather phase; rank 0 times out in its last wait,
    # and reuses its buffer at once: rank 1, which reads only then (it waits for rank 0's
    # file), must not return what it reads
    proc = launched["withdrawal", "allreduce", 2]
    results = {}
    for ln in proc.stdout.splitlines():
        words = ln.split()
        if "RESULT" in words:
            i = words.index("RESULT")
            results[words[i + 1]] = words[i + 2:]
    assert results.get("0", [""])[0] == "CommTimeoutError", proc.stdout + proc.stderr
    # rank 1 raises (the withdrawn buffer), or returns the right sum: never -1 or a mix
    one = results.get("1")
    assert one is not None, proc.stdout + proc.stderr
    assert one[0] != "ok" or one[1:] == ["3.0", "3.0"], one


_WITHDRAWAL = """
    import os, time, numpy as np, pycomm
    from pycomm import shmdirect
    comm = pycomm.init()
    comm._engine.timeout = float(os.environ["WAIT_S"])
    r, n = comm.rank, comm.size
    count = 1 << 15                      # one rank's block: n * 256 KiB in all, <= 1 MiB
    if "{collective}" == "allgather":
        send = np.full(count, r + 1.0)
        out = np.full(count * n, 7.0)
        call = lambda: comm.Allgather(send, out)
        want = np.repeat(np.arange(1.0, n + 1), count)
    elif "{collective}" == "bcast":      # from root 0: its buffer is the one reused
        send = out = np.full(count * n, 3.0 if r == 0 else 0.0)
        call = lambda: comm.Bcast(send, root=0)
        want = np.full(count * n, 3.0)
    else:
        send = np.full(count * n, r + 1.0)
        out = np.full(count, 7.0)
        call = lambda: comm.Reduce_scatter_block(send, out)
        want = np.full(count, n * (n + 1) / 2)
    assert comm.chosen_algorithm("{collective}", count * n * 8) == "shm_direct"
    comm.Barrier()

    if r == 1:
        # descheduled before its first read, until every peer has failed and reused its
        # buffer
        read = shmdirect._Reads.read
        state = {{"slept": False}}
        def slow_read(self, *args):
            if not state["slept"]:
                state["slept"] = True
                wait_for(*[f"reused-{{k}}" for k in range(n) if k != 1])
            return read(self, *args)
        shmdirect._Reads.read = slow_read
    try:
        call()
        print("RESULT", r, "ok", bool((out == want).all()), out[0], out[-1], flush=True)
    except pycomm.CommError as exc:
        send[...] = -1.0                    # the user reuses its buffer at once
        mine = comm._slots.direct_reads.words
        withdrawn = any(mine[p][r][2] & 3 == 1 for p in (0, 1))
        print("RESULT", r, type(exc).__name__, withdrawn, flush=True)
        open(f"reused-{{r}}", "w").close()
    if r == 1:
        open("done-1", "w").close()
    else:
        wait_for("done-1")                  # alive while rank 1 reads (else: ESRCH)
"""


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("collective", ["reduce_scatter_block", "allgather", "bcast"])
def test_a_rank_that_fails_withdraws_its_block_before_a_slow_peer_reads_it(
        launched, collective, n):
    # as the all-reduce's test above: rank 1 is descheduled before it reads anything; the
    # others time out waiting for it, withdraw, and reuse their buffers at once; only then
    # does rank 1 read them: it must not return what it read
    proc = launched["withdrawal", collective, n]
    out = proc.stdout + proc.stderr
    results = {}
    for ln in proc.stdout.splitlines():
        words = ln.split()
        if "RESULT" in words:
            i = words.index("RESULT")
            results[words[i + 1]] = words[i + 2:]
    assert sorted(results) == [str(k) for k in range(n)], out
    # rank 1 raises (a peer's withdrawn buffer), or returns the right result: never the
    # -1.0 of a reused buffer, or a mix
    one = results["1"]
    assert one[0] == "CollectiveError" or one[:2] == ["ok", "True"], one
    for k in range(n):
        if k != 1:      # failed (a timeout, or a peer's withdrawal) and withdrew
            assert results[str(k)][0] in ("CommTimeoutError", "CollectiveError"), out
            assert results[str(k)][1] == "True", out


_ROOT_WRITES = """
    import os, time, numpy as np, pycomm
    from pycomm import shmdirect
    from transports.cma import CrossMemory
    comm = pycomm.init()
    comm._engine.timeout = float(os.environ["WAIT_S"])
    r = comm.rank
    buf = np.full(1 << 16, 3.0 if r == 0 else 0.0)      # 512 KiB: one chunk, direct
    assert comm.chosen_algorithm("bcast", buf.nbytes) == "shm_direct"
    comm.Barrier()

    if r == 0 and "{case}" == "in-flight":
        # past the check for a withdrawal, the write starts after rank 1's timeout (1.5 s)
        # and ends within its grace (1 s)
        write = CrossMemory.write_live
        def slow_write(self, *args):
            time.sleep(1.9)
            return write(self, *args)
        CrossMemory.write_live = slow_write
    elif r == 0:
        # held up before it checks, until rank 1 has returned, past its grace
        write = shmdirect._Reads.write
        def late_write(self, *args):
            wait_for("returned-1")
            return write(self, *args)
        shmdirect._Reads.write = late_write
    try:
        comm.Bcast(buf, root=0)
        print("RESULT", r, "ok", flush=True)
    except pycomm.CommError as exc:
        note = "may write one more chunk" in "".join(getattr(exc, "__notes__", []))
        kept = len(comm._slots.direct_reads.kept)
        print("RESULT", r, type(exc).__name__, buf.min(), buf.max(), note, kept, flush=True)
        if r == 1:
            buf[...] = -1.0                 # the user reuses its buffer at once
            open("returned-1", "w").close()
    if r == 0:
        open("done-0", "w").close()
    else:
        wait_for("done-0")                  # the root's call has ended
        print("AFTER", r, bool((buf == -1.0).all()), flush=True)
"""


def _results(proc) -> dict:
    out = {}
    for ln in proc.stdout.splitlines():
        words = ln.split()
        for key in ("RESULT", "AFTER"):
            if key in words:
                i = words.index(key)
                out[key, words[i + 1]] = words[i + 2:]
    return out


def test_a_peer_that_fails_while_the_root_writes_returns_after_the_write(launched):
    # rank 1 times out at 1.5 s waiting for the root, which writes its half at 1.9 s:
    # rank 1 returns only once it has (its whole buffer holds the root's 3.0), so the -1
    # it then writes stays; without the wait the root's 3.0 landed in the reused buffer
    proc = launched["root writes", "in-flight"]
    got = _results(proc)
    assert got.get(("RESULT", "1"), [""])[:5] == ["CommTimeoutError", "3.0", "3.0", "False",
                                                  "0"], proc.stdout + proc.stderr
    # the root fails on rank 1's withdrawal, or (rank 1 descheduled past its own deadline
    # after it had marked its reads done) completes: its buffer is no longer read
    assert got.get(("RESULT", "0"), [""])[0] in ("CollectiveError", "ok"), \
        proc.stdout + proc.stderr
    assert got.get(("AFTER", "1")) == ["True"], proc.stdout + proc.stderr


def test_a_root_held_up_past_the_grace_writes_nothing_and_the_peer_is_told(launched):
    # the root is held up before its write until rank 1 has returned (after its 1 s grace):
    # rank 1's error says the buffer may still be written, and keeps it referenced; the
    # root, seeing rank 1 withdrawn, writes nothing
    proc = launched["root writes", "late"]
    got = _results(proc)
    one = got.get(("RESULT", "1"), [""])
    assert one[0] == "CommTimeoutError" and one[3:5] == ["True", "1"], proc.stdout + proc.stderr
    assert one[1] == "0.0" and one[2] == "3.0", one     # the head read, the tail not written
    assert got.get(("RESULT", "0"), [""])[0] == "CollectiveError", proc.stdout + proc.stderr
    assert got.get(("AFTER", "1")) == ["True"], proc.stdout + proc.stderr
