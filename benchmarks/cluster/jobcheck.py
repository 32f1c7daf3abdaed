"""What a job of check_app.py must print, for tests that run it under a real job engine.

:func:`missing_lines` compares a job's output with the line every rank of
``benchmarks/cluster/check_app.py`` prints when its Allreduce, Bcast and Allgather matched
numpy: its rank and size, its host, every rank's host, the transports, the world's host
layout and its local rank and size, given where the engine placed each rank (``hostmap``:
rank -> emulated host number). :func:`clean_env` is an environment free of every engine's
variables (so that a job sees only those of the engine that starts it). The checks every
such test makes after a job: :func:`finish` (the job's output, or a failure when it runs
past its time), :func:`hosts_left_clean` (no process but each host's holder, no /dev/shm
segment) and :func:`processes_with_env` (what outlived a job that marked its processes).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

__all__ = ["APP", "ROOT", "clean_env", "expected_line", "finish", "hosts_left_clean",
           "missing_lines", "processes_with_env"]

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "benchmarks" / "cluster" / "check_app.py")
_ENGINE_PREFIXES = ("PYCOMM_", "MASTER_", "SLURM_", "PMI_", "PMIX_", "OMPI_", "MPI_", "HYDI_",
                    "HYDRA_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                    "GROUP_RANK")


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without any engine's variables, pycomm importable, ``extra`` added."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_ENGINE_PREFIXES)}
    env.update({"PYTHONPATH": str(ROOT), "PYCOMM_TIMEOUT": "30", **extra})
    return env


def expected_line(rank: int, hostmap: list[int], host: str = "host{}") -> str:
    """check_app.py's line for ``rank`` when rank r runs on host ``host.format(hostmap[r])``."""
    size = len(hostmap)
    name = host.format
    names = ",".join(name(h) for h in hostmap)
    order = sorted(set(hostmap), key=hostmap.index)          # hosts by their lowest rank
    layout = "|".join(",".join(str(r) for r in range(size) if hostmap[r] == h) for h in order)
    mine = [q for q in range(size) if hostmap[q] == hostmap[rank]]
    links = "+".join(t for t, need in (("shm", len(mine) > 1), ("tcp", len(order) > 1))
                     if need)
    return (f"OK rank {rank}/{size} host {name(hostmap[rank])} hosts {names} transport "
            f"{links} layout {layout} names {','.join(name(h) for h in order)} "
            f"local {mine.index(rank)}/{len(mine)}")


def missing_lines(out: str, hostmap: list[int], host: str = "host{}") -> list[str]:
    """The expected lines not in ``out`` (launchers forward each write as it comes, so
    ranks' lines may run into each other at their ends), and one entry per extra OK line."""
    missing = [want for r in range(len(hostmap))
               if not re.search(re.escape(want := expected_line(r, hostmap, host))
                                + r"(\n|OK|$)", out)]
    extra = out.count("OK rank ") - len(hostmap)
    return missing + [f"{extra} OK lines too many"] * (extra > 0)


def finish(p: subprocess.Popen, timeout: float, what: str, logs: str = "") -> tuple[int, str]:
    """Wait up to ``timeout`` seconds for the job ``p`` (stdout piped, text); return its exit
    code and output.

    Raises:
        AssertionError: it still ran after ``timeout`` (it is killed first; the message
            holds its output and ``logs``).
    """
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate(timeout=10)
        raise AssertionError(f"{what} still ran after {timeout} s:\n{out}\n{logs}") from None
    return p.returncode, out


def hosts_left_clean(cluster, settle: float = 5.0) -> None:
    """Assert that no emulated host of ``cluster`` (benchmarks/cluster/netns.py) runs a
    process but its holder, waiting up to ``settle`` seconds (remote daemons exit just
    after their launcher), and that no host's /dev/shm holds a segment."""
    for k in range(1, cluster.n + 1):
        deadline = time.monotonic() + settle
        while True:
            pids = subprocess.run(["ip", "netns", "pids", cluster.ns(k)],
                                  capture_output=True, text=True).stdout.split()
            left = [p for p in pids if int(p) != cluster._holders[k].pid]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert not left, f"host {k}: processes left: {left}"
        shm = cluster.run(k, ["ls", "-A", "/dev/shm"]).stdout.split()
        assert not shm, f"host {k}: /dev/shm still holds {shm}"


def processes_with_env(entry: str) -> list[int]:
    """The processes (other than this one) whose environment holds ``entry``
    (``NAME=value``): a job that puts a mark in its environment finds all it started."""
    want, pids = entry.encode(), []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/environ", "rb") as fh:
                    if want in fh.read().split(b"\0"):
                        pids.append(int(name))
            except OSError:
                pass
    return pids
