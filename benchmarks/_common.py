"""Shared harness of the OSU-style benchmarks: options, communicator, sizes, statistics, data.

Every benchmark runs the same body on pycomm (the default) or on mpi4py (``--mpi4py``),
because both expose the same names (``COMM_WORLD``, ``Send``, ``Isend``, ``Allreduce``,
``Wtime``, ``IN_PLACE``, ``SUM``...). That makes the MPI figures a side-by-side reference
measured by the very same loop.

Options shared by all benchmarks (OSU's letters where OSU has one):

- ``-m MIN:MAX``  message sizes in bytes, powers of two from MIN to MAX (``-m 1024`` is MAX
  only; ``-m 8:`` leaves MAX at its default). Size 0 is kept when MIN is 0.
  ``--sizes 8,4096,1M`` gives an explicit list instead (K/M/G suffixes are powers of 1024).
- ``-i ITER`` / ``-x WARMUP``  timed and warm-up iterations for sizes up to 8 KiB; larger
  sizes use ``--iter-large`` / ``--warmup-large`` (OSU's ``LARGE_MESSAGE_SIZE`` rule).
- ``-f``  full statistics: Min, Max and Iterations columns.
- ``-c``  validation: every iteration's result is checked against a numpy reference; a
  wrong result is reported on stderr and makes the exit status 1 (timings taken with
  ``-c`` include the refills and are not for quoting).
- ``--dtype NAME``  element type of the buffers (float32 by default).
- ``--max-time S``  cap: after the warm-up, cut the timed iterations of one size so that
  it takes about S seconds (rank 0 decides, every rank follows). Off by default.
- ``--transport NAME``  informational: the launcher chooses the transport
  (``python launch.py --transport tcp -n 2 ...``); the header prints ``comm.transport_name``
  and a mismatch is reported on stderr.
- ``--mpi4py``  use ``mpi4py.MPI`` instead of ``pycomm``.
- ``--json FILE`` / ``--csv FILE``  write every row with the run's metadata (rank 0).
- ``-q``  no progress lines on stderr.

API used from the communication module beyond ``COMM_WORLD``: ``comm.rank``, ``comm.size``,
``comm.Barrier()``, ``comm.Bcast(array, root=0)``, ``comm.gather(obj, root=0)``,
``comm.bcast(obj, root=0)``, ``Wtime()``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from _report import Report

__all__ = [
    "BUSBW_FACTORS",
    "DTYPES",
    "LARGE_MESSAGE_SIZE",
    "Comm",
    "Pattern",
    "Progress",
    "Report",
    "Stats",
    "agree_iterations",
    "busbw_factor",
    "loop_counts",
    "machine_info",
    "make_parser",
    "mismatch",
    "parse_size",
    "parse_sizes",
    "pycomm_version",
    "run_metadata",
    "select_comm",
    "sizes_from_args",
    "summarize",
    "waitall",
]

#: Sizes above this many bytes use the "large" iteration counts (OSU's rule).
LARGE_MESSAGE_SIZE = 8192

#: Element types ``--dtype`` accepts (the values of the validation pattern fit them all).
DTYPES = ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8",
          "uint16", "uint32", "uint64", "complex64", "complex128")

#: nccl-tests' bus-bandwidth factor per collective, as a function of the world size n:
#: busbw = algbw * factor(n), where algbw = S / t and S is the size nccl-tests uses (the
#: whole buffer: for allgather and alltoall n times the per-rank/per-peer block, for
#: reduce_scatter the whole send buffer, for gather/scatter the root's whole buffer).
#: Source: nccl-tests doc/PERFORMANCE.md ("Bus bandwidth": AllReduce 2(n-1)/n,
#: ReduceScatter and AllGather (n-1)/n, Broadcast and Reduce 1) and, for the collectives
#: PERFORMANCE.md does not list, nccl-tests' src/alltoall.cu, gather.cu, scatter.cu
#: (factor (n-1)/n). Barrier and scan have no bus bandwidth (None).
BUSBW_FACTORS: dict[str, Any] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "bcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def busbw_factor(collective: str, n: int) -> float | None:
    """Return nccl-tests' bus-bandwidth factor for ``collective`` on ``n`` ranks, or None.

    The v-variants use their plain twin's factor (``allgatherv`` → ``allgather``), the
    nonblocking ones their blocking twin's (``iallreduce`` → ``allreduce``).
    """
    name = collective.lower()
    if name.startswith("i") and name[1:] in _FACTOR_NAMES:
        name = name[1:]
    name = _FACTOR_NAMES.get(name, name)
    fn = BUSBW_FACTORS.get(name)
    return None if fn is None else float(fn(n))


_FACTOR_NAMES = {"allreduce": "allreduce", "reduce_scatter": "reduce_scatter",
                 "reduce_scatter_block": "reduce_scatter", "allgather": "allgather",
                 "allgatherv": "allgather", "alltoall": "alltoall", "alltoallv": "alltoall",
                 "gather": "gather", "gatherv": "gather", "scatter": "scatter",
                 "scatterv": "scatter", "bcast": "bcast", "reduce": "reduce",
                 "barrier": "barrier", "scan": "scan"}


@dataclass
class Comm:
    """The chosen communication module and its world communicator.

    Attributes:
        mod: ``pycomm`` or ``mpi4py.MPI``; gives ``SUM``, ``IN_PLACE``, ``Wtime``, ``Request``.
        comm: its ``COMM_WORLD``.
        name: ``"pycomm"`` or ``"mpi4py"``.
        label: what goes in the header, e.g. ``"pycomm 0.1.0, transport shm"``.
        transport: ``comm.transport_name`` for pycomm, ``"mpi"`` for mpi4py.
        version: the library's version (pycomm's, or mpi4py's with the MPI library's).
    """

    mod: Any
    comm: Any
    name: str
    label: str
    transport: str = "unknown"
    version: str = "unknown"

    @property
    def rank(self) -> int:
        """This process's rank in the world."""
        return self.comm.rank

    @property
    def size(self) -> int:
        """Number of ranks in the world."""
        return self.comm.size


def pycomm_version() -> str:
    """Return pycomm's version without starting a world (``"unknown"`` when absent)."""
    try:
        import pycomm

        return str(getattr(pycomm, "__version__", "unknown"))
    except Exception:  # noqa: BLE001  (metadata only: never fail a run over it)
        try:
            from importlib.metadata import version

            return version("pycomm")
        except Exception:  # noqa: BLE001
            return "unknown"


def _mpi_library(mpi: Any) -> str:
    """Return e.g. ``"MPICH 5.0.2"`` from ``MPI.Get_library_version()``."""
    first = mpi.Get_library_version().strip().splitlines()[0]
    if first.startswith("MPICH Version:"):
        return "MPICH " + first.split(":", 1)[1].strip()
    if first.startswith("Open MPI"):
        return first.split(",")[0].strip()
    return first[:40]


def select_comm(use_mpi4py: bool) -> Comm:
    """Import the communication module chosen on the command line.

    Args:
        use_mpi4py: True for ``mpi4py.MPI`` (run under ``mpiexec``), False for ``pycomm``
            (run under ``python launch.py``).

    Returns:
        The :class:`Comm` bundle with the world communicator.
    """
    if use_mpi4py:
        import mpi4py
        from mpi4py import MPI

        lib = _mpi_library(MPI)
        return Comm(MPI, MPI.COMM_WORLD, "mpi4py", f"mpi4py {mpi4py.__version__}, {lib}",
                    "mpi", f"mpi4py {mpi4py.__version__}, {lib}")
    # Make ``import pycomm`` work from a checkout without installing it.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    import pycomm

    comm = pycomm.COMM_WORLD
    transport = getattr(comm, "transport_name", None) or \
        os.environ.get("PYCOMM_TRANSPORT", "unknown")
    version = pycomm_version()
    return Comm(pycomm, comm, "pycomm", f"pycomm {version}, transport {transport}",
                transport, version)


def parse_size(text: str) -> int:
    """Parse ``4096``, ``4K``, ``4KiB``, ``16M``, ``1G`` (powers of 1024) into bytes.

    Raises:
        argparse.ArgumentTypeError: not a non-negative size.
    """
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = 1
    if t and t[-1] in "KMG":
        scale = 1024 ** ("KMG".index(t[-1]) + 1)
        t = t[:-1]
    try:
        value = int(t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"negative size: {text!r}")
    return value


def parse_sizes(text: str, default_min: int, default_max: int) -> list[int]:
    """Parse ``MIN:MAX`` (either side may be empty; ``MAX`` alone is allowed).

    Returns:
        Sizes in bytes: 0 when MIN is 0, then the powers of two from max(MIN, 1) to MAX.

    Raises:
        argparse.ArgumentTypeError: the text is not of that form, or MIN > MAX.
    """
    lo, hi = default_min, default_max
    if ":" in text:
        a, b = text.split(":", 1)
        lo = parse_size(a) if a.strip() else lo
        hi = parse_size(b) if b.strip() else hi
    elif text.strip():
        hi = parse_size(text)
    if lo < 0 or hi < lo:
        raise argparse.ArgumentTypeError(f"-m {text!r}: need 0 <= MIN <= MAX")
    sizes = [0] if lo == 0 else []
    size = 1
    while size <= hi:
        if size >= lo:
            sizes.append(size)
        size *= 2
    return sizes


def sizes_from_args(args: argparse.Namespace, default_min: int, default_max: int) -> list[int]:
    """Return ``--sizes`` when given, else the ``-m`` sweep (sorted, without duplicates)."""
    if getattr(args, "sizes", None):
        return sorted({parse_size(s) for s in args.sizes.split(",") if s.strip()})
    return parse_sizes(args.message_size, default_min, default_max)


def make_parser(description: str, *, iters: int, warmup: int, iters_large: int,
                warmup_large: int) -> argparse.ArgumentParser:
    """Return an argument parser with the shared options (benchmarks add their own)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("-m", "--message-size", metavar="MIN:MAX", default="",
                   help="message sizes in bytes, powers of two from MIN to MAX")
    p.add_argument("--sizes", metavar="LIST", default=None,
                   help="explicit comma-separated sizes instead of -m (e.g. 8,4K,1M)")
    p.add_argument("-i", "--iterations", type=int, default=iters, metavar="ITER",
                   help=f"timed iterations for sizes <= {LARGE_MESSAGE_SIZE} B "
                        f"(default {iters})")
    p.add_argument("-x", "--warmup", type=int, default=warmup, metavar="WARMUP",
                   help=f"warm-up iterations for sizes <= {LARGE_MESSAGE_SIZE} B "
                        f"(default {warmup})")
    p.add_argument("--iter-large", type=int, default=iters_large, metavar="ITER",
                   help=f"timed iterations for larger sizes (default {iters_large})")
    p.add_argument("--warmup-large", type=int, default=warmup_large, metavar="WARMUP",
                   help=f"warm-up iterations for larger sizes (default {warmup_large})")
    p.add_argument("-f", "--full", action="store_true",
                   help="full statistics: Min, Max and Iterations columns")
    p.add_argument("-c", "--validate", action="store_true",
                   help="check every iteration's result against numpy; exit 1 when wrong")
    p.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="element type of the buffers (default float32)")
    p.add_argument("--max-time", type=float, default=None, metavar="S",
                   help="cap the timed iterations of each size at about S seconds "
                        "(estimated from the warm-up; default: no cap)")
    p.add_argument("--transport", default=None, choices=("shm", "tcp", "auto"),
                   help="informational: the launcher picks the transport "
                        "(launch.py --transport); a mismatch is reported")
    p.add_argument("--mpi4py", action="store_true",
                   help="use mpi4py.MPI (run under mpiexec) instead of pycomm")
    p.add_argument("--json", metavar="FILE", default=None,
                   help="also write every row and the run's metadata as JSON (rank 0)")
    p.add_argument("--csv", metavar="FILE", default=None,
                   help="also write every row and the run's metadata as CSV (rank 0)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def check_transport(c: Comm, wanted: str | None) -> None:
    """Report on stderr (rank 0) when ``--transport`` differs from the one in use."""
    if wanted in (None, "auto") or c.name != "pycomm" or c.rank != 0:
        return
    if wanted not in c.transport.split("+"):
        print(f"# note: --transport {wanted} asked, but the launcher gave {c.transport}; "
              f"choose it with: python launch.py --transport {wanted} -n N script.py",
              file=sys.stderr)


def loop_counts(args: argparse.Namespace, size: int) -> tuple[int, int]:
    """Return (timed iterations, warm-up iterations) for a message of ``size`` bytes."""
    if size > LARGE_MESSAGE_SIZE:
        return max(1, args.iter_large), max(0, args.warmup_large)
    return max(1, args.iterations), max(0, args.warmup)


def agree_iterations(c: Comm, iters: int, warmup_seconds: float, warmup: int,
                     max_time: float | None) -> int:
    """Cut ``iters`` so one size takes about ``max_time`` s; rank 0's estimate wins.

    Every rank must call this (it broadcasts), and only when ``max_time`` is set.
    """
    per_iter = warmup_seconds / warmup if warmup else 0.0
    want = iters
    if per_iter > 0 and max_time is not None:
        want = int(min(iters, max(1, max_time / per_iter)))
    box = np.array([want], dtype=np.int64)
    c.comm.Bcast(box, root=0)
    return int(box[0])


def waitall(c: Comm, requests: list) -> None:
    """Complete ``requests``: ``Request.Waitall`` when the module has it, else one by one."""
    request_cls = getattr(c.mod, "Request", None)
    fn = getattr(request_cls, "Waitall", None)
    if fn is not None:
        fn(requests)
    else:
        for r in requests:
            r.Wait()


# -- statistics ---------------------------------------------------------------------------

@dataclass
class Stats:
    """Average, minimum and maximum over ranks of each rank's mean seconds per iteration."""

    avg: float
    min: float
    max: float
    iterations: int


def summarize(per_rank: list[float], iterations: int) -> Stats:
    """Summarize the per-rank mean times (seconds) the way OSU's -f columns do."""
    if not per_rank:
        raise ValueError("no timings to summarize")
    return Stats(sum(per_rank) / len(per_rank), min(per_rank), max(per_rank), iterations)


# -- validation data ----------------------------------------------------------------------

class Pattern:
    """Deterministic test data: small integers 1..7 so that sums stay exact in every dtype.

    ``data(key, it, count)`` is element k = ((k + 3 * key + it) mod 7) + 1, where ``key``
    names the contribution (a rank, or a (sender, receiver) block) and ``it`` the iteration,
    so a stale buffer from the previous iteration never passes.
    """

    def __init__(self, dtype: str | np.dtype):
        self.dtype = np.dtype(dtype)
        self._idx = np.arange(0, dtype=np.int64)

    def data(self, key: int, it: int, count: int) -> np.ndarray:
        """Return the ``count`` elements contributed under ``key`` at iteration ``it``."""
        if self._idx.size < count:
            self._idx = np.arange(max(count, 2 * self._idx.size), dtype=np.int64)
        return ((self._idx[:count] + (3 * key + it)) % 7 + 1).astype(self.dtype)

    def total(self, keys, it: int, count: int) -> np.ndarray:
        """Return the element-wise SUM of ``data(k, it, count)`` over ``keys``, in dtype."""
        acc = np.zeros(count, dtype=self.dtype)
        for k in keys:
            acc += self.data(k, it, count)   # wraps in integer dtypes, as MPI's SUM does
        return acc


def mismatch(got: np.ndarray, want: np.ndarray, what: str) -> str | None:
    """Return a description of the first difference between ``got`` and ``want``, or None."""
    got, want = np.asarray(got).ravel(), np.asarray(want).ravel()
    if got.shape != want.shape:
        return f"{what}: {got.size} elements, expected {want.size}"
    bad = np.flatnonzero(got != want)
    if bad.size == 0:
        return None
    i = int(bad[0])
    return (f"{what}: {bad.size} of {got.size} elements wrong, first at {i}: "
            f"{got[i]!r} != {want[i]!r}")


# -- metadata and progress ----------------------------------------------------------------

def machine_info() -> dict[str, Any]:
    """Describe this machine: host, cores, CPU model, kernel, versions, date, load average.

    The load average (1, 5, 15 min) is there because other work on a 2-core machine moves
    every figure; a run with a load well above the rank count is suspect.
    """
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "host": socket.gethostname(),
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def run_metadata(c: Comm | None, benchmark: str, *, algorithm: str | None = None,
                 dtype: str | None = None, **extra: Any) -> dict[str, Any]:
    """Return the metadata written with every row of ``--json`` / ``--csv``.

    Keys: benchmark, library, library_version, world_size, transport, algorithm, dtype,
    host, cpu_count, pycomm_version, date, loadavg (1-minute figure, and the three in JSON's
    ``machine``), plus ``extra``.
    """
    m = machine_info()
    return {
        "benchmark": benchmark,
        "library": c.name if c else "none",
        "library_version": c.version if c else "",
        "world_size": c.size if c else 1,
        "transport": c.transport if c else "none",
        "algorithm": algorithm or ("auto" if c and c.name == "pycomm" else "default"),
        "dtype": dtype or "",
        "host": m["host"],
        "cpu_count": m["nproc"],
        "pycomm_version": pycomm_version(),
        "date": m["date"],
        "loadavg": m["loadavg"][0] if m["loadavg"] else None,
        **extra,
    }


class Progress:
    """Progress of a sweep on stderr (rank 0), once the sweep has run for ``after`` s."""

    def __init__(self, name: str, total: int, enabled: bool, after: float = 2.0):
        self.name, self.total, self.enabled, self.after = name, total, enabled, after
        self.t0 = time.perf_counter()
        self.done = 0

    def step(self, what: str) -> None:
        """Count one finished step (a size, or a size x algorithm) named ``what``."""
        self.done += 1
        elapsed = time.perf_counter() - self.t0
        if self.enabled and elapsed >= self.after:
            print(f"# {self.name}: {self.done}/{self.total} done ({what}), "
                  f"{elapsed:.0f} s", file=sys.stderr, flush=True)
