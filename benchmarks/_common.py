"""Shared harness of the OSU-style benchmarks: options, communicator choice, sizes, output.

Every benchmark runs the same body on pycomm (the default) or on mpi4py (``--mpi4py``),
because both expose the same names (``COMM_WORLD``, ``Send``, ``Isend``, ``Allreduce``,
``Wtime``, ``IN_PLACE``, ``SUM``...). That makes the MPI figures a side-by-side reference
measured by the very same loop.

Options shared by all benchmarks (OSU's letters where OSU has one):

- ``-m MIN:MAX``  message sizes in bytes, powers of two from MIN to MAX (``-m 1024`` is MAX
  only; ``-m 8:`` leaves MAX at its default). Size 0 is kept when MIN is 0.
- ``-i ITER`` / ``-x WARMUP``  timed and warm-up iterations for sizes up to 8 KiB; larger
  sizes use ``--iter-large`` / ``--warmup-large`` (OSU's ``LARGE_MESSAGE_SIZE`` rule).
- ``--max-time S``  optional cap: after the warm-up, cut the timed iterations of one size so
  that it takes about S seconds (rank 0 decides, every rank follows). Off by default.
- ``--mpi4py``  use ``mpi4py.MPI`` instead of ``pycomm``.
- ``--json FILE``  also write the rows, the library and the machine to FILE (rank 0).

API used from the communication module beyond ``COMM_WORLD``: ``comm.rank``, ``comm.size``,
``comm.Barrier()``, ``comm.Bcast(array, root=0)``, ``comm.gather(obj, root=0)``, ``Wtime()``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "LARGE_MESSAGE_SIZE", "Comm", "make_parser", "parse_sizes", "select_comm", "loop_counts",
    "agree_iterations", "machine_info", "Report", "waitall",
]

#: Sizes above this many bytes use the "large" iteration counts (OSU's rule).
LARGE_MESSAGE_SIZE = 8192


@dataclass
class Comm:
    """The chosen communication module and its world communicator.

    Attributes:
        mod: ``pycomm`` or ``mpi4py.MPI``; gives ``SUM``, ``IN_PLACE``, ``Wtime``, ``Request``.
        comm: its ``COMM_WORLD``.
        name: ``"pycomm"`` or ``"mpi4py"``.
        label: what goes in the header, e.g. ``"pycomm 0.1.0, transport shm"``.
    """

    mod: Any
    comm: Any
    name: str
    label: str

    @property
    def rank(self) -> int:
        """This process's rank in the world."""
        return self.comm.rank

    @property
    def size(self) -> int:
        """Number of ranks in the world."""
        return self.comm.size


def _pycomm_label(mod: Any, comm: Any) -> str:
    """Return ``"pycomm VERSION, transport NAME"``, as far as pycomm tells these."""
    version = getattr(mod, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version
            version = dist_version("pycomm")
        except Exception:  # not installed as a distribution: running from the checkout
            version = "unknown"
    transport = None
    for attr in ("transport_name", "transport"):
        value = getattr(comm, attr, None)
        if value is not None:
            transport = value if isinstance(value, str) else getattr(value, "name", None)
            if transport:
                break
    if not transport:
        transport = os.environ.get("PYCOMM_TRANSPORT", "auto")
    return f"pycomm {version}, transport {transport}"


def _mpi4py_label(mpi: Any) -> str:
    """Return ``"mpi4py VERSION, <MPI library> VERSION"`` (e.g. ``MPICH 5.0.2``)."""
    import mpi4py

    first = mpi.Get_library_version().strip().splitlines()[0]
    if first.startswith("MPICH Version:"):
        lib = "MPICH " + first.split(":", 1)[1].strip()
    elif first.startswith("Open MPI"):
        lib = first.split(",")[0].strip()
    else:
        lib = first[:40]
    return f"mpi4py {mpi4py.__version__}, {lib}"


def select_comm(use_mpi4py: bool) -> Comm:
    """Import the communication module chosen on the command line.

    Args:
        use_mpi4py: True for ``mpi4py.MPI`` (run under ``mpiexec``), False for ``pycomm``
            (run under ``python launch.py``).

    Returns:
        The :class:`Comm` bundle with the world communicator.
    """
    if use_mpi4py:
        from mpi4py import MPI

        return Comm(MPI, MPI.COMM_WORLD, "mpi4py", _mpi4py_label(MPI))
    # Make ``import pycomm`` work from a checkout without installing it.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    import pycomm

    comm = pycomm.COMM_WORLD
    return Comm(pycomm, comm, "pycomm", _pycomm_label(pycomm, comm))


def parse_sizes(text: str, default_min: int, default_max: int) -> list[int]:
    """Parse ``MIN:MAX`` (either side may be empty; ``MAX`` alone is allowed).

    Returns:
        Sizes in bytes: 0 when MIN is 0, then the powers of two from max(MIN, 1) to MAX.

    Raises:
        argparse.ArgumentTypeError: the text is not of that form, or MIN > MAX.
    """
    lo, hi = default_min, default_max
    try:
        if ":" in text:
            a, b = text.split(":", 1)
            lo = int(a) if a.strip() else lo
            hi = int(b) if b.strip() else hi
        elif text.strip():
            hi = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"-m expects MIN:MAX in bytes, got {text!r}") from None
    if lo < 0 or hi < lo:
        raise argparse.ArgumentTypeError(f"-m {text!r}: need 0 <= MIN <= MAX")
    sizes = [0] if lo == 0 else []
    size = 1
    while size <= hi:
        if size >= lo:
            sizes.append(size)
        size *= 2
    return sizes


def make_parser(description: str, *, iters: int, warmup: int, iters_large: int,
                warmup_large: int) -> argparse.ArgumentParser:
    """Return an argument parser with the shared options (benchmarks add their own)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("-m", "--message-size", metavar="MIN:MAX", default="",
                   help="message sizes in bytes, powers of two from MIN to MAX")
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
    p.add_argument("--max-time", type=float, default=None, metavar="S",
                   help="cap the timed iterations of each size at about S seconds "
                        "(estimated from the warm-up; default: no cap)")
    p.add_argument("--mpi4py", action="store_true",
                   help="use mpi4py.MPI (run under mpiexec) instead of pycomm")
    p.add_argument("--json", metavar="FILE", default=None,
                   help="also write the results as JSON to FILE (rank 0)")
    return p


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


def machine_info() -> dict[str, Any]:
    """Describe this machine: cores, CPU model, kernel, versions, date, load average.

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
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


@dataclass
class Report:
    """Prints OSU-style header and rows on rank 0 and collects them for ``--json``.

    Args:
        title: e.g. ``"OSU MPI Latency Test"``.
        label: library and transport, from :class:`Comm` (or ``"python sockets"``...).
        columns: (JSON key, title, width, format) per column, e.g.
            ``("latency_us", "Latency (us)", 18, ".2f")``; the first is the size in bytes.
        enabled: print only where True (rank 0).
    """

    title: str
    label: str
    columns: list[tuple[str, str, int, str]]
    enabled: bool = True
    meta: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def header(self, *extra: str) -> None:
        """Print ``# TITLE (LABEL)``, any extra comment lines, then the column names."""
        if not self.enabled:
            return
        print(f"# {self.title} ({self.label})")
        for line in extra:
            print(f"# {line}")
        names = "".join(f"{title:>{width}}" for _, title, width, _ in self.columns[1:])
        print(f"# {self.columns[0][1]:<{self.columns[0][2] - 2}}{names}", flush=True)

    def row(self, *values: Any) -> None:
        """Print one row (size first) and keep it for the JSON file."""
        if not self.enabled:
            return
        self.rows.append({key: v for (key, _, _, _), v in zip(self.columns, values, strict=True)})
        cells = [f"{values[0]:<{self.columns[0][2]}d}"]
        for (_, _, width, fmt), v in zip(self.columns[1:], values[1:], strict=True):
            cells.append(f"{v:>{width}{fmt}}" if v is not None else f"{'-':>{width}}")
        print("".join(cells), flush=True)

    def write_json(self, path: str | None, benchmark: str, **extra: Any) -> None:
        """Write benchmark name, label, machine, ``extra`` and the rows to ``path``."""
        if not self.enabled or not path:
            return
        doc = {"benchmark": benchmark, "library": self.label, "machine": machine_info(),
               **self.meta, **extra, "rows": self.rows}
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
