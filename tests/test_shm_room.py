"""A /dev/shm too small for the job: a clear error where the shared memory is reserved,
never a rank killed by SIGBUS in the middle of a call.

A page of a tmpfs file is allocated when a process first touches it, and a touch that
finds the tmpfs full kills the toucher with SIGBUS (a container's /dev/shm is 64 MiB unless
``--shm-size`` says otherwise). Each case runs a job in a mount namespace of its own whose
/dev/shm is a tmpfs of the size the case needs (``unshare --mount``, root): the segment's
rings are reserved at start-up, a communicator's collective slots when its first
collective sets them up, an MPI window's memory when it is made
(transports/shmring.py, "Room").

These tests need root and unshare; where a namespace cannot be made they FAIL with the
reason, as the emulated-host tests do.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pycomm.shmcoll import _block_bytes
from transports.shmring import CTRL_BYTES, MIN_RING_BYTES, RING_HDR_BYTES, fitted_ring_bytes

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = str(ROOT / "launch.py")
RING = 65536                            # PYCOMM_SHM_RING_BYTES of the small cases
SLOT = 64 << 10                         # PYCOMM_SHM_COLL_BYTES (the default)


def _in_small_shm(kib: int, argv: list[str], env: dict | None = None,
                  timeout: float = 60.0) -> tuple[int, str]:
    """Run ``argv`` with /dev/shm a fresh tmpfs of ``kib`` KiB; return its exit status
    and output, then what /dev/shm held after it (a line ``left: ...``)."""
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to give a job a small /dev/shm")
    script = (f"mount -t tmpfs -o size={kib}k tmpfs /dev/shm || exit 97; "
              '"$@"; rc=$?; echo "left: $(ls -A /dev/shm)"; exit $rc')
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           script, "sh", *argv], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout, env=env,
                          check=False)
    if proc.returncode == 97 or proc.stdout.startswith("unshare:"):
        pytest.fail(f"could not make a mount namespace with a small /dev/shm (root is "
                    f"needed): {proc.stdout.strip()}")
    return proc.returncode, proc.stdout


def _env(**extra) -> dict:
    import os
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


def _program(tmp_path, text: str) -> str:
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


# Every rank sends every other enough to wrap each 1 MiB ring, then checks a sum.
TRAFFIC = """
    import numpy as np, pycomm
    c = pycomm.init()
    big = np.ones((c.size, 2048)); out = np.empty_like(big)
    for _ in range(300):
        c.Alltoall(big, out)
        for p in range(c.size):
            if p != c.rank:
                c.Sendrecv(big[0], p, recvbuf=out[0], source=p)
    total = np.empty(1)
    c.Allreduce(np.array([float(c.rank)]), total)
    print(f"finished over {c.transport_name}, sum {total[0]}", flush=True)
"""


def test_a_job_whose_rings_do_not_fit_stops_at_start_naming_dev_shm(tmp_path):
    # 4 ranks of 3 rings of 1 MiB each (the size set): 12 MiB of rings in an 8 MiB
    # /dev/shm. The old transport started, then killed a rank by SIGBUS once traffic had
    # filled /dev/shm.
    rc, out = _in_small_shm(8 << 10, [sys.executable, LAUNCH, "-n", "4", "--transport", "shm",
                                      _program(tmp_path, TRAFFIC)],
                            _env(PYCOMM_SHM_RING_BYTES=str(1 << 20)))
    assert rc != 0, out
    assert "SIGBUS" not in out, out
    assert "finished" not in out, out
    assert "could not start the world: /dev/shm has no room for rank" in out, out
    assert "inbound rings of 1048576 bytes (PYCOMM_SHM_RING_BYTES)" in out, out
    assert "--shm-size" in out and "--transport tcp" in out, out
    assert out.rstrip().endswith("left:"), out        # nothing left in /dev/shm


def test_ring_size_fitted_to_the_room():
    # A container's 64 MiB: 1 MiB rings while the segments take at most half of it,
    # then halvings of that, down to 64 KiB (returned even where it does not fit)
    block = _block_bytes(SLOT)
    mib = 1 << 20
    assert [fitted_ring_bytes(n, 64 * mib, mib, block) for n in (2, 4, 7, 8, 16, 64)] == \
        [mib, mib, 512 << 10, 512 << 10, 64 << 10, 64 << 10]
    assert fitted_ring_bytes(4, 8 * mib, mib, block) == 256 << 10
    assert fitted_ring_bytes(2, 1 << 40, 4096, block) == 4096      # never larger
    for n in range(2, 40):
        for room in (8 * mib, 64 * mib, 1 << 30):
            ring = fitted_ring_bytes(n, room, mib, block)
            segments = n * (CTRL_BYTES + (n - 1) * (RING_HDR_BYTES + ring) + block)
            assert ring == mib or ring == MIN_RING_BYTES or (
                2 * segments <= room < 2 * n * (CTRL_BYTES + (n - 1) * (
                    RING_HDR_BYTES + 2 * ring) + block)), (n, room, ring)


def test_default_rings_shrink_to_fit_a_small_dev_shm_and_say_so_once(tmp_path):
    # 4 ranks' 1 MiB rings would take 12.5 of 8 MiB: the host's ranks agree on 256 KiB
    # rings (3.5 MiB), keep shared memory, and rank 0 says so once.
    prog = _program(tmp_path, TRAFFIC + """
    t = c._engine.route[(c.rank + 1) % c.size]
    print(f"rank {c.rank} rings of {t.ring_bytes} bytes", flush=True)
    """)
    rc, out = _in_small_shm(8 << 10, [sys.executable, LAUNCH, "-n", "4", prog], _env())
    assert rc == 0, out
    notes = [ln for ln in out.splitlines() if "pycomm: /dev/shm has" in ln]
    assert len(notes) == 1 and notes[0].startswith("[0] "), out
    assert "the 4 ranks of host" in notes[0] and \
        "use shared-memory rings of 256 KiB, not 1024 KiB" in notes[0], out
    assert out.count("finished over shm, sum 6.0") == 4, out
    for r in range(4):
        assert f"[{r}] rank {r} rings of 262144 bytes" in out, out
    assert out.rstrip().endswith("left:"), out
    # over TCP there are no rings to fit, and nothing to say
    rc, out = _in_small_shm(8 << 10, [sys.executable, LAUNCH, "-n", "4", "--transport",
                                      "tcp", _program(tmp_path, TRAFFIC)], _env())
    assert rc == 0 and out.count("finished over tcp, sum 6.0") == 4, out
    assert "pycomm: /dev/shm" not in out, out


def test_auto_links_a_host_over_tcp_where_its_dev_shm_cannot_hold_the_job(tmp_path):
    # The same job in 1 MiB: even 64 KiB rings need 1.3 MiB. The ranks see, before any
    # segment is made, that their /dev/shm is too small, say so once and talk over TCP.
    rc, out = _in_small_shm(1 << 10, [sys.executable, LAUNCH, "-n", "4",
                                      _program(tmp_path, TRAFFIC)], _env())
    assert rc == 0, out
    warnings = [ln for ln in out.splitlines() if "pycomm: /dev/shm has" in ln]
    assert len(warnings) == 1 and warnings[0].startswith("[0] "), out
    assert "shared memory between this host's 4 ranks needs 2 MiB (3 rings of 65536 " \
        "bytes a rank" in warnings[0], out
    assert "talk over TCP instead" in warnings[0], out
    assert out.count("finished over tcp, sum 6.0") == 4, out
    assert out.rstrip().endswith("left:"), out


def test_a_read_only_dev_shm_is_tcp_for_auto_and_a_clear_error_for_shm(tmp_path):
    prog = _program(tmp_path, TRAFFIC)
    argv = [sys.executable, LAUNCH, "-n", "2", prog]
    script = ["sh", "-c", 'mount -o remount,ro /dev/shm && exec "$@"', "sh"]
    rc, out = _in_small_shm(1024, script + argv, _env())
    assert rc == 0, out
    assert "pycomm: /dev/shm cannot be written (mount a writable tmpfs there)" in out, out
    assert out.count("finished over tcp, sum 1.0") == 2, out
    rc, out = _in_small_shm(1024, script + argv[:-1] + ["--transport", "shm", prog], _env())
    assert rc != 0 and "finished" not in out, out
    assert "could not start the world: cannot make the shared-memory segment /dev/shm/" \
        "pycomm-" in out, out
    assert "Read-only file system; the shm transport needs a writable /dev/shm" in out, out


def test_a_communicator_whose_slots_do_not_fit_runs_its_collectives_by_messages(tmp_path):
    # Room for the world's rings and slots and for a block and a half more: the Dup's
    # slots (a block on each of 4 ranks) do not fit. Its collectives go by messages on
    # every rank, each rank says so once; the world keeps its slots.
    rings = CTRL_BYTES + 3 * (RING_HDR_BYTES + RING)
    block = _block_bytes(SLOT)
    kib = -(-(4 * (rings + block) + 3 * block // 2) // 4096) * 4
    prog = _program(tmp_path, """
        import numpy as np, pycomm
        c = pycomm.init()
        a = np.ones(4); b = np.empty_like(a)
        c.Allreduce(a, b)
        print("world", b[0], flush=True)
        d = c.Dup()
        for i in range(3):
            d.Allreduce(a * (c.rank + i), b)
            print(f"call {i}: {b[0]}", flush=True)
        x = np.arange(3.0) if c.rank == 2 else np.zeros(3)
        d.Bcast(x, root=2)
        print("dup bcast", x.tolist(), "slots", d._slots, "world's", c._slots is not None,
              flush=True)
        c.Allreduce(a * 2, b)
        print("world again", b[0], flush=True)
    """)
    rc, out = _in_small_shm(kib, [sys.executable, LAUNCH, "-n", "4", prog],
                            _env(PYCOMM_SHM_RING_BYTES=str(RING)))
    assert rc == 0, out
    assert "SIGBUS" not in out and "Error" not in out, out
    for r in range(4):
        for i in range(3):
            assert f"[{r}] call {i}: {6.0 + 4 * i}" in out, out
        assert f"[{r}] dup bcast [0.0, 1.0, 2.0] slots None world's True" in out, out
        assert f"[{r}] world again 8.0" in out, out
        notes = [ln for ln in out.splitlines() if ln.startswith(f"[{r}] pycomm: rank {r}: ")]
        assert len(notes) == 1, out
        assert "no room for the collective slots of pycomm.COMM_WORLD.Dup (block 1)" in \
            notes[0] and "pycomm.COMM_WORLD.Dup's collective calls go by messages " \
            "instead" in notes[0], notes[0]
    assert out.rstrip().endswith("left:"), out


def test_members_that_disagree_on_the_room_agree_call_by_call(tmp_path):
    # Rank 1 alone finds no room for the Dup's slots (forced here: /dev/shm's room can
    # change between two ranks' reservations); its peers have slots. They see its mark
    # where they would wait for it, and every call goes by messages, with numpy's
    # results: slot-sized calls, direct-read-sized ones and object calls, after waits of
    # both kinds (rank 1 late, and rank 1 early).
    prog = _program(tmp_path, """
        import time
        import numpy as np, pycomm
        from pycomm import shmcoll
        from transports.shmring import ShmSpaceError
        c = pycomm.init()
        if c.rank == 1:
            made = shmcoll.SharedSlots.__init__
            def refuse(self, comm, shm):
                if comm._cid != 0:
                    raise ShmSpaceError("no room (forced by the test)")
                made(self, comm, shm)
            shmcoll.SharedSlots.__init__ = refuse
        d = c.Dup()
        n = d.size
        for late in (1, 0, 2):
            if c.rank == late:
                time.sleep(0.3)
            for count in (4, 1 << 17):
                x = np.arange(count, dtype=np.float64) + c.rank
                y = np.empty_like(x)
                d.Allreduce(x, y)
                assert np.array_equal(y, n * np.arange(count) + n * (n - 1) / 2), count
                z = x.copy() if c.rank == late else np.zeros(count)
                d.Bcast(z, root=late)
                assert np.array_equal(z, np.arange(count) + late), count
                g = np.empty((n, count))
                d.Allgather(x, g)
                assert all(np.array_equal(g[r], np.arange(count) + r) for r in range(n))
            d.Barrier()
            assert d.allreduce(c.rank) == n * (n - 1) // 2
        print(f"rank {c.rank} agreed, slots {d._slots is not None}", flush=True)
        # Room again: once every member has freed d, its block goes to the next
        # communicator, and rank 1's mark of d (pycomm.slotblocks clears it) no longer
        # sends that communicator's calls by messages
        if c.rank == 1:
            shmcoll.SharedSlots.__init__ = made
        block = d._block
        d.Free()
        c.Barrier()
        e = c.Dup()
        x = np.ones(4)
        e.Allreduce(pycomm.IN_PLACE, x)
        assert np.array_equal(x, np.full(4, float(n)))
        shm = shmcoll.host_shm(e)
        marks = sum(bool(shm.control_words(w)[shmcoll.NO_SLOTS] & (1 << e._block))
                    for w in e._world)
        print(f"rank {c.rank} reused {e._block == block}, slots {e._slots is not None}, "
              f"marks {marks}", flush=True)
    """)
    proc = subprocess.run([sys.executable, LAUNCH, "-n", "4", prog], capture_output=True,
                          text=True, timeout=120, env=_env(), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for r in range(4):
        assert f"[{r}] rank {r} agreed, slots {r != 1}" in out, out
        assert f"[{r}] rank {r} reused True, slots True, marks 0" in out, out
    assert out.count("no room (forced by the test)") == 1, out


def test_a_window_larger_than_dev_shm_raises_err_no_mem_on_every_rank(tmp_path):
    prog = _program(tmp_path, """
        from pycomm import MPI
        c = MPI.COMM_WORLD
        try:
            MPI.Win.Allocate((6 << 20) if c.rank == 1 else 4096, comm=c)
            print(f"rank {c.rank}: allocated", flush=True)
        except MPI.Exception as exc:
            print(f"rank {c.rank}: class {exc.Get_error_class()} == {MPI.ERR_NO_MEM}: "
                  f"{exc}", flush=True)
        w = MPI.Win.Allocate(4096, comm=c)
        w.Free()
        print(f"rank {c.rank}: small window", flush=True)
    """)
    rc, out = _in_small_shm(4 << 10, [sys.executable, LAUNCH, "-n", "3", "--mpi4py", prog],
                            _env(PYCOMM_SHM_RING_BYTES=str(RING)))
    assert rc == 0, out
    assert "allocated" not in out and "SIGBUS" not in out, out
    for r in range(3):
        line = next(ln for ln in out.splitlines() if f"rank {r}: class" in ln)
        assert "class 34 == 34" in line, line
        assert "Win.Allocate: the window's memory could not be made: rank 1:" in line, line
        assert "No space left on device" in line, line
        assert f"rank {r}: small window" in out, out
    assert out.rstrip().endswith("left:"), out
