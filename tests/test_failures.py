"""Failures on fresh, throwaway worlds: dead peers, timeouts, and what is left afterwards
(the failures that leave their world usable run on the shared worlds of conftest.py).

The promise under test (DESIGN.md, "Timeouts and failure" and "Cleanup"): a peer that dies
turns every operation waiting on it into an exception naming the peer, on every surviving
rank, within a few seconds, never a hang; every blocking wait is bounded by ``timeout=``;
no process or /dev/shm segment outlives the job.

The survivors' side is observed with a bare :class:`pycomm.launch.launcher.RankGroup`, which does
not stop the other ranks when one dies (a Pool or ``launch.py`` would SIGTERM them at
once): each survivor writes what its blocked call raised to a file and exits. Those worlds
run four at a time, from a module fixture; each test checks one. The parent's
side is observed through :class:`pycomm.Pool` and :func:`pycomm.spawn`.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

import pycomm
from pycomm.launch.launcher import RankGroup, shm_prefix

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = Path(__file__).resolve().parents[1]
FEW_SECONDS = 5.0
TRANSPORTS = ("shm", "tcp")

# Fresh worlds: the shared pool is closed first (conftest.no_shared_world). The timeouts,
# withdrawn sends and a rank's exception leave their world usable: they run on the shared
# 2- and 3-rank worlds instead (conftest.world).
fresh_world = pytest.mark.usefixtures("no_shared_world")
SHARED_PAIRS = [(2, "shm"), (2, "tcp")]

# One rank (the victim) dies half a second after a barrier, while the others are blocked
# in a call that needs it; each survivor records what that call raised and how long it took
# (not counting the half second).
SURVIVOR_PROGRAM = textwrap.dedent("""
    import json, os, signal, sys, time
    import numpy as np
    import pycomm

    out_dir, how, victim, call = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    comm = pycomm.COMM_WORLD
    comm.Barrier()
    if comm.rank == victim:
        time.sleep(0.5)
        if how == "exit":
            os._exit(3)
        if how == "finish":         # its program ends: pycomm closes and says goodbye
            sys.exit(0)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    result = {"error": None, "pid": os.getpid()}
    try:
        if call == "recv":
            comm.Recv(np.zeros(4), victim, 0)
        elif call == "recv_any":
            comm.Recv(np.zeros(4), pycomm.ANY_SOURCE, 0)
        elif call == "send":          # 1 MiB: rendezvous, waits for the receiver's answer
            comm.Send(np.zeros(1 << 17), victim, 0)
        else:
            comm.Allreduce(pycomm.IN_PLACE, np.ones(1000))
    except Exception as exc:
        result.update(error=type(exc).__name__, message=str(exc),
                      peer=getattr(exc, "peer", None))
    result["seconds"] = time.monotonic() - t0 - 0.5
    with open(os.path.join(out_dir, f"rank{comm.rank}.json.tmp"), "w") as fh:
        json.dump(result, fh)
    os.rename(os.path.join(out_dir, f"rank{comm.rank}.json.tmp"),
              os.path.join(out_dir, f"rank{comm.rank}.json"))
    if call != "allreduce":
        # Stay until every survivor has reported, so that the victim is the only rank
        # gone while the others wait (else a survivor could see this one leave first).
        others = [r for r in range(comm.size) if r != victim]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(
                os.path.exists(os.path.join(out_dir, f"rank{r}.json")) for r in others):
            time.sleep(0.02)
    os._exit(0)     # the world is broken: do not linger in finalize
""")


def shm_segments(job_id: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(shm_prefix(job_id)))


def alive(pid: int) -> bool:
    """Whether ``pid`` is still a live (non-zombie) process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def start_survivors(folder, transport: str, nprocs: int, how: str, victim: int,
                    call: str) -> RankGroup:
    """Start SURVIVOR_PROGRAM on a fresh world of ``nprocs`` ranks (results in ``folder``)."""
    script = folder / "rank.py"
    script.write_text(SURVIVOR_PROGRAM)
    group = RankGroup(nprocs, transport=transport, timeout=30.0)
    try:
        group.start([str(script), str(folder), how, str(victim), call],
                    {"PYTHONPATH": str(ROOT)})
    except BaseException:
        group.close()
        raise
    return group


def finish_survivors(group: RankGroup, folder) -> tuple[dict, bool, list, bool]:
    """Wait for a world of :func:`start_survivors`; (results by rank, whether every rank
    exited within 30 s, segments left in /dev/shm, whether a rank process outlived it)."""
    try:
        finished = group.wait_exit(30.0)
        results = {r: json.loads((folder / f"rank{r}.json").read_text())
                   for r in range(group.nprocs) if (folder / f"rank{r}.json").exists()}
    finally:
        group.close()
    return (results, finished, shm_segments(group.job_id),
            any(alive(p.pid) for p in group.procs))


# (transport, nprocs, how, victim, call) of every survivors' world; they run a few at a
# time (fixture survivors): most of each one's seconds go to start-up and to waiting
SURVIVOR_CASES = [(t, 3, how, 2, call) for t in TRANSPORTS
                  for how, call in [("exit", "recv"), ("sigkill", "recv"),
                                    ("sigkill", "recv_any"), ("sigkill", "send"),
                                    ("finish", "recv"), ("finish", "send")]] + \
    [(t, 4, "sigkill", 1, "allreduce") for t in TRANSPORTS]
AT_ONCE = 4


@pytest.fixture(scope="module")
def survivors(tmp_path_factory) -> dict:
    """Every world of SURVIVOR_CASES, AT_ONCE at a time: case -> finish_survivors(...)."""
    from conftest import _CACHE
    _CACHE.close()              # fresh worlds, nothing shared beside them
    out = {}
    for i in range(0, len(SURVIVOR_CASES), AT_ONCE):
        wave = {}
        try:
            for case in SURVIVOR_CASES[i:i + AT_ONCE]:
                folder = tmp_path_factory.mktemp("survivors")
                wave[case] = (start_survivors(folder, *case), folder)
        finally:
            for case, (group, folder) in wave.items():
                out[case] = finish_survivors(group, folder)
    return out


def run_survivors(survivors: dict, transport: str, nprocs: int, how: str, victim: int,
                  call: str) -> dict:
    """The survivors' results of one case of the fixture, after its clean-up checks."""
    results, finished, segments, outlived = survivors[transport, nprocs, how, victim, call]
    assert finished, "a survivor hung instead of failing"
    assert not segments, "segments left in /dev/shm"
    assert not outlived, "a rank process outlived the job"
    return results


@fresh_world
@pytest.mark.parametrize("how,call", [("exit", "recv"), ("sigkill", "recv"),
                                      ("sigkill", "recv_any"), ("sigkill", "send"),
                                      ("finish", "recv"), ("finish", "send")])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_blocked_p2p_fails_naming_the_dead_peer(survivors, transport, how, call):
    results = run_survivors(survivors, transport, 3, how, victim=2, call=call)
    assert sorted(results) == [0, 1]
    for rank, res in results.items():
        assert res["error"] == "PeerError", f"rank {rank}: {res}"
        assert res["peer"] == 2 and "rank 2" in res["message"], f"rank {rank}: {res}"
        assert res["seconds"] < FEW_SECONDS, f"rank {rank} noticed after {res['seconds']:.1f} s"


@fresh_world
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_blocked_collective_fails_instead_of_hanging(survivors, transport):
    """In a collective a survivor may be waiting on another survivor that already failed
    and left, so the rank named is one that is gone, not necessarily the victim."""
    results = run_survivors(survivors, transport, 4, "sigkill", victim=1, call="allreduce")
    assert sorted(results) == [0, 2, 3]
    for rank, res in results.items():
        assert res["error"] == "PeerError", f"rank {rank}: {res}"
        assert res["peer"] != rank and f"rank {res['peer']}" in res["message"]
        assert res["seconds"] < 2 * FEW_SECONDS, f"rank {rank}: {res['seconds']:.1f} s"


def _die_while_peer_receives(how: str):
    import signal
    comm = pycomm.COMM_WORLD
    if comm.rank == 1:
        time.sleep(0.3)
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    comm.Recv(np.zeros(1), 1)


@fresh_world
@pytest.mark.parametrize("how", ["exit", "sigkill"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_pool_reports_the_dead_rank_and_cleans_up(transport, how):
    pool = pycomm.Pool(2, transport=transport, timeout=30.0)
    job_id, pids = pool.job_id, pool.pids
    t0 = time.monotonic()
    try:
        with pytest.raises(pycomm.PeerError, match="rank 1") as info:
            pool.run(_die_while_peer_receives, how)
        assert time.monotonic() - t0 < FEW_SECONDS
        assert info.value.peer == 1
        with pytest.raises(pycomm.CommError, match="broken"):
            pool.run(os.getpid)
    finally:
        pool.close()
    assert not shm_segments(job_id)
    assert not any(alive(p) for p in pids)


def _recv_timeouts():
    """Rank 0 times out on receives nobody answers; then rank 1 sends, and it must land in
    the receive posted afterwards (a receive that timed out must not swallow it)."""
    comm = pycomm.COMM_WORLD
    out = {}
    if comm.rank == 0:
        for name, call in [
            ("Recv", lambda: comm.Recv(np.zeros(2), 1, 5, timeout=0.5)),
            ("recv", lambda: comm.recv(source=1, tag=6, timeout=0.5)),
            ("Probe", lambda: comm.Probe(1, 7, timeout=0.5)),
            ("Irecv.Wait", lambda: out.setdefault("req", comm.Irecv(np.zeros(2), 1, 8))
             .Wait(timeout=0.5)),
        ]:
            t0 = time.monotonic()
            try:
                call()
                out[name] = ("no error", "", 0.0)
            except Exception as exc:  # noqa: BLE001 - the parent checks the type
                out[name] = (type(exc).__name__, str(exc), time.monotonic() - t0)
    comm.Barrier()
    if comm.rank == 1:
        comm.Send(np.array([1.0, 2.0]), 0, 5)
        comm.send("object", 0, 6)
        comm.Send(np.array([3.0, 4.0]), 0, 8)
        return None
    buf = np.zeros(2)
    comm.Recv(buf, 1, 5, timeout=10)
    out["after Recv"] = buf.tolist()
    out["after recv"] = comm.recv(source=1, tag=6, timeout=10)
    req = out.pop("req")
    req.Wait(timeout=10)        # the nonblocking request survives its own timeout
    out["after Wait"] = True
    return out


@pytest.mark.parametrize("world", SHARED_PAIRS, indirect=True, ids=["n2-shm", "n2-tcp"])
def test_timeout_on_blocking_calls(world):
    out = world.run(_recv_timeouts, timeout=30.0)[0]
    for name in ("Recv", "recv", "Probe", "Irecv.Wait"):
        kind, message, seconds = out[name]
        assert kind == "CommTimeoutError", f"{name}: {kind} {message}"
        assert "rank 0" in message and "0.5 s" in message, f"{name}: {message}"
        assert 0.5 <= seconds < 2.5, f"{name} took {seconds:.2f} s"
    assert "receive from rank 1" in out["Recv"][1]
    assert out["after Recv"] == [1.0, 2.0]
    assert out["after recv"] == "object"
    assert out["after Wait"] is True


def _send_timeouts():
    """Large (rendezvous) sends that time out or are cancelled are withdrawn: a receive
    posted later never gets them, and one that matched already fails or has the data."""
    comm = pycomm.COMM_WORLD
    n = 1 << 18                                  # 2 MiB of float64: above the eager limit
    out = {}
    if comm.rank == 0:
        first = np.full(n, 1.0)
        t0 = time.monotonic()
        try:
            comm.Send(first, 1, 5, timeout=0.5)  # rank 1 is not receiving yet
            out["Send"] = ("no error", "", 0.0)
        except Exception as exc:  # noqa: BLE001 - the parent checks the type
            out["Send"] = (type(exc).__name__, str(exc), time.monotonic() - t0)
        first[:] = -1.0                          # the caller owns the buffer again
        try:                                     # the object form withdraws its bytes too
            comm.send(np.full(n, 4.0), 1, 6, timeout=0.5)
            out["send"] = "no error"
        except Exception as exc:  # noqa: BLE001 - the parent checks the type
            out["send"] = type(exc).__name__
        comm.Barrier()
        comm.Send(np.full(n, 2.0), 1, 5, timeout=10)
        comm.send("second object", 1, 6, timeout=10)
        # Cancel after the receiver matched: it has answered CTS (tcp) or read (shm)
        req = comm.Isend(np.full(n, 3.0), 1, 9)
        comm.Barrier()                           # rank 1 posts its receive after this
        time.sleep(1.0)                          # ... and matches it while we do not progress
        req.Cancel()
        req.Wait(timeout=10)
        out["cancelled"] = req.cancelled
        comm.Barrier()
        return out
    comm.Barrier()
    buf = np.zeros(n)
    comm.Recv(buf, 0, 5, timeout=10)
    out["after Send timeout"] = sorted(set(buf.tolist()))
    out["after send timeout"] = comm.recv(source=0, tag=6, timeout=10)
    comm.Barrier()
    late = np.zeros(n)
    r = comm.Irecv(late, 0, 9)
    t_end = time.monotonic() + 0.5
    while time.monotonic() < t_end and not r.done:
        r.Test()
    try:
        r.Wait(timeout=10)
        out["late"] = ("data", sorted(set(late.tolist())))
    except Exception as exc:  # noqa: BLE001 - the parent checks the type
        out["late"] = (type(exc).__name__, str(exc))
    comm.Barrier()
    return out


@pytest.mark.parametrize("world", SHARED_PAIRS, indirect=True, ids=["n2-shm", "n2-tcp"])
def test_timed_out_or_cancelled_large_send_is_withdrawn(world):
    sender, receiver = world.run(_send_timeouts, timeout=60.0)
    kind, message, seconds = sender["Send"]
    assert kind == "CommTimeoutError" and "rank 0" in message, message
    assert 0.5 <= seconds < 2.5
    # the withdrawn message never arrives: the next Recv gets the second one, intact
    assert receiver["after Send timeout"] == [2.0]
    assert sender["send"] == "CommTimeoutError"
    assert receiver["after send timeout"] == "second object"
    # the receiver matched during the sender's sleep: its CTS or FIN is waiting, so the
    # cancel finds the message handed over and fails (MPI's Test_cancelled: False)
    late = receiver["late"]
    if sender["cancelled"]:     # withdrawn in a race with the receiver: told so
        assert late[0] == "CommError" and "withdrawn by its sender" in late[1], late
    else:
        assert late == ("data", [3.0])


def _identity():
    return os.getpid(), os.environ["PYCOMM_JOB_ID"], sorted(os.listdir("/dev/shm"))


@fresh_world
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_spawn_leaves_no_process_or_segment(transport):
    results = pycomm.spawn(_identity, 3, transport=transport)
    job_id = results[0][1]
    assert {r[1] for r in results} == {job_id}
    assert not shm_segments(job_id)
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid, _, _ in results) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid, _, _ in results), "spawn left a rank process behind"


def _raise_on_rank(bad: int):
    comm = pycomm.COMM_WORLD
    comm.Barrier()
    if comm.rank == bad:
        raise ValueError(f"deliberate failure on rank {bad}")
    return comm.rank


@pytest.mark.parametrize("world", [(3, "shm")], indirect=True, ids=["n3-shm"])
def test_rank_exception_comes_back_with_traceback_and_pool_survives(world):
    pool = world.pool
    with pytest.raises(pycomm.RemoteError) as info:
        pool.run(_raise_on_rank, 2)
    err = info.value
    assert err.rank == 2 and err.exc_type == "ValueError"
    assert "deliberate failure on rank 2" in str(err)
    assert "_raise_on_rank" in err.remote_traceback
    assert pool.run(_raise_on_rank, -1) == [0, 1, 2]


def _default_timeouts():
    """No ``timeout=``: PYCOMM_TIMEOUT (the pool's timeout) bounds the wait. Rank 1 never
    sends and never joins the barrier."""
    comm = pycomm.COMM_WORLD
    if comm.rank == 1:
        return None
    out = {}
    for name, call in [("Recv", lambda: comm.Recv(np.zeros(1), 1, 0)),
                       ("Barrier", lambda: comm.Barrier())]:
        t0 = time.monotonic()
        try:
            call()
            out[name] = ("no error", "", 0.0)
        except Exception as exc:  # noqa: BLE001 - the parent checks the type
            out[name] = (type(exc).__name__, str(exc), time.monotonic() - t0)
    return out


@fresh_world
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_pycomm_timeout_bounds_waits_without_timeout_argument(transport):
    with pycomm.Pool(2, transport=transport, timeout=1.0) as pool:
        out = pool.run(_default_timeouts, timeout=20.0)[0]
    for name, (kind, message, seconds) in out.items():
        assert kind == "CommTimeoutError", f"{name}: {kind} {message}"
        assert 1.0 <= seconds < 3.0, f"{name} took {seconds:.2f} s"
