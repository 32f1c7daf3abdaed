"""What a job of check_app.py must print, and what a test that runs jobs under a real job
engine (or launch.py) across emulated hosts does before and after them.

:func:`missing_lines` compares a job's output with the line every rank of
``benchmarks/cluster/check_app.py`` prints when its Allreduce, Bcast and Allgather matched
numpy: its rank and size, its host, every rank's host, the transports, the world's host
layout and its local rank and size, given where the engine placed each rank (``hostmap``:
rank -> emulated host number); :func:`assert_lines` asserts every rank's line and no extra
one. :func:`clean_env` is an environment free of every engine's variables (so that a job
sees only those of the engine that starts it).

Before the jobs: :func:`launcher` (the engine's launcher, found by its ``--version``, or
the test skipped saying what was looked for), :func:`emulated_hosts` (a module fixture's
hosts, or the test skipped where network namespaces cannot be made; none left behind
after it), :func:`started` (a harness that starts the engine's daemons on them),
:func:`port_taken` (a port rank 0 cannot bind, for the failure cases) and
:func:`launch_nodes` (launch.py's agents of a multi-node job, one per emulated host).
After a job: :func:`finish` / :func:`finish_all` (the output, or a failure when it runs
past its time), :func:`hosts_left_clean` (no process but each host's holder, no /dev/shm
segment) and :func:`processes_with_env` / :func:`assert_none_with_env` (what outlived a
job that marked its processes).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from .netns import Cluster, ClusterError, check_support

__all__ = ["APP", "ROOT", "assert_lines", "assert_none_with_env", "clean_env",
           "emulated_hosts", "expected_line", "finish", "finish_all", "hosts_left_clean",
           "launch_nodes", "launcher", "missing_lines", "port_taken", "processes_with_env",
           "started"]

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


def assert_lines(out: str, hostmap: list[int], host: str = "host{}") -> None:
    """Assert that ``out`` holds every rank's expected line and no extra one."""
    missing = missing_lines(out, hostmap, host)
    assert not missing, (missing, out)


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


def assert_none_with_env(entry: str, what: str, settle: float = 5.0) -> None:
    """Assert that no process holds ``entry`` in its environment (waiting up to ``settle``
    seconds for the last to exit); ``what`` names them in the failure."""
    deadline = time.monotonic() + settle
    while (left := processes_with_env(entry)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"{what}: {left}"


_LAUNCHERS: dict[str, tuple[str, re.Match] | str] = {}     # launcher()'s answers, by name


def launcher(name: str, candidates: Iterable[str | None], version: str, missing: str, *,
             failed: str | None = None, other: str | None = None) -> tuple[str, re.Match]:
    """The first of ``candidates`` (paths; None and repeats passed over) that is executable
    and whose ``--version`` output matches the regular expression ``version``: its path and
    the match. Asked once per process under ``name``; the same answer (or skip) after.

    Skips (pytest.skip) with ``missing`` where none is; with ``failed`` (formatted with
    ``path`` and ``exc``) where the last executable candidate's ``--version`` failed, or
    ``other`` (formatted with ``path``) where its output did not match, when given.
    """
    import pytest
    if name not in _LAUNCHERS:
        _LAUNCHERS[name] = _find_launcher(candidates, version, missing, failed, other)
    found = _LAUNCHERS[name]
    if isinstance(found, str):
        pytest.skip(found)
    return found


def _find_launcher(candidates, version, missing, failed, other) -> tuple[str, re.Match] | str:
    why = missing
    for path in dict.fromkeys(p for p in candidates if p):
        if not os.access(path, os.X_OK):
            continue
        try:
            info = subprocess.run([path, "--version"], capture_output=True, text=True,
                                  timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = missing if failed is None else failed.format(path=path, exc=exc)
            continue
        m = re.search(version, info)
        if m:
            return path, m
        why = missing if other is None else other.format(path=path)
    return why


@contextlib.contextmanager
def emulated_hosts(n: int, tag: str, unsupported=None,
                   why: str = "cannot build emulated hosts") -> Iterator[Cluster]:
    """A module fixture's ``n`` emulated hosts (benchmarks/cluster/netns.py), named
    ``<tag><pid>``; after them, no namespace of theirs may be left.

    Where namespaces cannot be made here, ``unsupported`` (default pytest.skip: the test
    needs an external engine's hosts) is called with ``why`` and the reason; a cluster
    that is supported but cannot be built fails (pytest.fail) with the same words.
    """
    import pytest
    try:
        check_support()
    except ClusterError as exc:
        (unsupported or pytest.skip)(f"{why}: {exc}")
    prefix = f"{tag}{os.getpid() % 10000}"
    try:
        cluster = Cluster(n, prefix=prefix).__enter__()
    except ClusterError as exc:
        pytest.fail(f"{why}: {exc}")
    try:
        yield cluster
    finally:
        cluster.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix + "-" not in listed, f"namespaces left behind: {listed}"


@contextlib.contextmanager
def started(make, error: type[Exception], failed: str):
    """Enter the harness ``make()`` returns (benchmarks/cluster/slurm.py's Slurm,
    ray_nodes.py's RayNodes) for a module fixture, and close it after; an engine that is
    installed but raises ``error`` on start fails (pytest.fail) with ``failed`` and why."""
    import pytest
    try:
        harness = make().__enter__()
    except error as exc:
        pytest.fail(f"{failed}: {exc}")
    try:
        yield harness
    finally:
        harness.__exit__(None, None, None)


@contextlib.contextmanager
def port_taken(cluster, k: int, port: int):
    """A process on host ``k`` of ``cluster`` listening on ``port`` (all addresses) for the
    duration: a port that a rank cannot bind."""
    blocker = cluster.popen(k, [sys.executable, "-c",
                                "import socket, time; s = socket.create_server(('0.0.0.0', "
                                f"{port})); print('bound', flush=True); time.sleep(120)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert blocker.stdout.readline().strip() == "bound"
        yield
    finally:
        blocker.kill()
        blocker.wait(10)


def launch_nodes(cluster, nnodes: int, nproc: int, port: int, program: list[str],
                 placement: str = "block", **env: str) -> list[subprocess.Popen]:
    """launch.py's agents of an ``nnodes`` x ``nproc`` job on ``cluster``: node k on host
    k + 1, the store on host 1 at ``port``, running ``program`` (argv after launch.py's
    options); in :func:`clean_env` with ``env`` (PYCOMM_TIMEOUT 30 s unless given), output
    piped (text, stderr with stdout)."""
    return [cluster.popen(k + 1, [sys.executable, "launch.py", "--nnodes", str(nnodes),
                                  "--node-rank", str(k), "--master-addr", cluster.addr(1),
                                  "--master-port", str(port), "--nproc-per-node", str(nproc),
                                  "--placement", placement, *program],
                          cwd=str(ROOT), env=clean_env(**env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
            for k in range(nnodes)]


def finish_all(procs: list[subprocess.Popen], timeout: float,
               what: str = "process") -> list[tuple[int, str]]:
    """:func:`finish` for each of ``procs`` in turn: [(exit code, output)] in their order."""
    return [finish(p, timeout, f"{what} {i}") for i, p in enumerate(procs)]
