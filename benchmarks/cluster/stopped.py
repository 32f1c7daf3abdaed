"""How long a stopped host's ranks take to be reported, on 2 emulated hosts (issue 16).

A job of 2 hosts x 2 ranks, started torchrun's way (ranks 0-1 on host1, 2-3 on host2,
``PYCOMM_PEER_TIMEOUT`` 3 s), loops an Allreduce (``check_app.py``'s ``CHECK_LOOP_S``);
host2's processes are then SIGSTOPped, and the script prints, per trial, the seconds from
the stop to the first ``PeerError`` line of host1's ranks and to the last of them exiting.
Needs root (network namespaces)::

    python -m benchmarks.cluster.stopped [--trials 3]

Scenarios: ``ranks`` (host2's ranks stopped: their process watches report it),
``everything`` (their watches too: a watch that accepts and never answers), ``gil``
(host2's ranks stopped while host1's ranks run a thread holding the GIL 1 s at a time).
:func:`host2_job` and :func:`watch_pids` serve tests/test_cluster.py too.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

from .jobcheck import APP, ROOT, clean_env
from .netns import Cluster

__all__ = ["host2_job", "watch_pids", "main"]

GIL_HOG = {"CHECK_GIL_HOG_RANKS": "0,1", "CHECK_GIL_HOG_S": "1.0"}


def host2_job(c, **extra: str) -> list[subprocess.Popen]:
    """Ranks 0-1 on host1 and 2-3 on host2 of cluster ``c``, torchrun's way, running
    check_app.py (PYCOMM_PEER_TIMEOUT 3 s, PYCOMM_TIMEOUT 60 s, output piped); returns the
    four processes, once rank 0 loops if CHECK_LOOP_S is given."""
    port = str(29200 + os.getpid() % 90)
    procs = [c.popen(1 + r // 2, [sys.executable, APP], cwd=str(ROOT),
                     env=clean_env(RANK=str(r), WORLD_SIZE="4", MASTER_ADDR=c.addr(1),
                                   MASTER_PORT=port, PYCOMM_TIMEOUT="60",
                                   PYCOMM_PEER_TIMEOUT="3", PYTHONFAULTHANDLER="1",
                                   **extra),
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(4)]
    if "CHECK_LOOP_S" in extra:
        line = procs[0].stdout.readline()
        if not line.startswith("LOOPING rank 0"):
            raise RuntimeError(f"rank 0 did not start its loop: {line!r}")
    return procs


def watch_pids(rank_pids: list[int], expect: int = 0, timeout: float = 10.0) -> list[int]:
    """The process watches (transports/procwatch.py) that the given ranks started; with
    ``expect``, looked for again until that many are there or ``timeout`` seconds have
    passed (a rank starts its watch once its world is up, and a watch shows as one only
    once it has exec'd: on a loaded machine one can still be starting)."""
    deadline = time.monotonic() + timeout
    while True:
        found = _watches_of(rank_pids)
        if len(found) >= expect or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def _watches_of(rank_pids: list[int]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
            if ppid in rank_pids:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if b"procwatch.py" in f.read():
                        found.append(int(entry))
        except OSError:
            continue
    return found


def _trial(scenario: str) -> tuple[float, float]:
    with Cluster(2, prefix=f"pcm{os.getpid() % 10000}") as c:
        procs = host2_job(c, CHECK_LOOP_S="40", **(GIL_HOG if scenario == "gil" else {}))
        try:
            time.sleep(0.5)
            stopped = [p.pid for p in procs[2:]]
            if scenario == "everything":
                stopped += watch_pids(stopped)
            t0 = time.monotonic()
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            errors, exits = [], []

            def follow(p):
                for line in p.stdout:
                    if line.startswith("pycomm.errors.PeerError"):
                        errors.append(time.monotonic() - t0)
                p.wait()
                exits.append(time.monotonic() - t0)
            readers = [threading.Thread(target=follow, args=(p,)) for p in procs[:2]]
            for t in readers:
                t.start()
            for t in readers:
                t.join(60)
        finally:
            for pid in watch_pids([p.pid for p in procs[2:]]) + [p.pid for p in procs[2:]]:
                os.kill(pid, signal.SIGCONT)
            for p in procs:
                p.kill()
                p.communicate()
        if not errors or len(exits) < 2:
            raise RuntimeError(f"{scenario}: host1's ranks did not end with a PeerError")
        return min(errors), max(exits)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--scenario", action="append",
                    choices=["ranks", "everything", "gil"], help="default: all three")
    args = ap.parse_args(argv)
    for scenario in args.scenario or ["ranks", "everything", "gil"]:
        for k in range(args.trials):
            err, done = _trial(scenario)
            print(f"{scenario:10s} trial {k}: first PeerError {err:.2f} s, last exit "
                  f"{done:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
