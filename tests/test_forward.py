"""The launcher's output forwarding (pycomm/launch/forward.py): the launcher's own lines
and the ranks' forwarded lines never land inside each other."""

from __future__ import annotations

import os
import threading

from pycomm.launch.forward import Forwarder, say


def test_launcher_lines_and_forwarded_lines_stay_whole(capfd):
    # A rank's plain (--mpi4py) output forwarded while the launcher says its own lines
    # from another thread, as when it stops a job: every line comes out whole. A print()
    # writes its text and its newline apart, and a rank's line forwarded between the two
    # joined the launcher's line.
    r, w = os.pipe()
    fwd = Forwarder(os.fdopen(r, "rb", buffering=0), 1, "stderr", prefix=False)
    fwd.start()
    rank_line = b"usage: python -m mpi4py.bench [options] <command> [args]\n"

    def rank():
        for _ in range(3000):
            os.write(w, rank_line)
        os.close(w)
    writer = threading.Thread(target=rank)
    writer.start()
    for i in range(3000):
        say(f"pycomm.launch: line {i}")
    writer.join()
    fwd.join(timeout=30)
    assert not fwd.is_alive()
    lines = capfd.readouterr().err.splitlines()
    assert lines.count(rank_line.decode().rstrip("\n")) == 3000
    assert [ln for ln in lines if ln.startswith("pycomm.launch: ")] == \
        [f"pycomm.launch: line {i}" for i in range(3000)]
    assert len(lines) == 6000, [ln for ln in lines if not ln.startswith(("usage", "pycomm"))]


def test_say_waits_for_a_forwarded_write_in_progress(capfd):
    lock = Forwarder.locks["stderr"]
    lock.acquire()
    try:
        t = threading.Thread(target=say, args=("pycomm.launch: after",))
        t.start()
        t.join(timeout=0.2)
        assert t.is_alive()             # held back while a forwarder writes
        assert capfd.readouterr().err == ""
    finally:
        lock.release()
    t.join(timeout=5)
    assert capfd.readouterr().err == "pycomm.launch: after\n"
