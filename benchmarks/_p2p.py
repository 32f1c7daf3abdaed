"""The point-to-point benchmarks' shared body: options, buffers, timing, rows.

A point-to-point script defines ``one(it)``, one iteration on this rank (a round trip, a
window), and hands it to :func:`sweep`, which runs warm-up and timed iterations per size
between Barriers, as OSU does. Without ``-f``/``-c`` the whole timed loop is timed once;
with ``-f`` each iteration is timed (Min/Max columns), and with ``-c`` each iteration also
writes the pattern of iteration ``it`` before sending and checks what arrived (inside the
timed region: timings taken with ``-c`` are for correctness, not for quoting).

``--pickle`` uses the lowercase object methods (``send``/``recv``/``isend``) on numpy
arrays, as OMB-Py's pickle variants do: the cost of pickling and of the object protocol
is then in the figure. Sizes are bytes; ``--dtype`` (uint8 by default here) sets the
element type, and sizes smaller than one element are skipped.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from _common import (
    Comm,
    Pattern,
    Progress,
    Report,
    agree_iterations,
    check_transport,
    loop_counts,
    make_parser,
    mismatch,
    run_metadata,
    select_comm,
    sizes_from_args,
)

__all__ = ["P2P", "Checker", "setup", "sweep"]


@dataclass
class P2P:
    """A parsed point-to-point run: options, communicator, sizes, report, pattern."""

    args: argparse.Namespace
    c: Comm
    sizes: list[int]
    report: Report
    pattern: Pattern
    dtype: np.dtype
    notes: list[str]


class Checker:
    """Collects this rank's validation failures (first few kept)."""

    def __init__(self):
        self.count, self.first = 0, None

    def check(self, got: Any, want: np.ndarray, what: str) -> None:
        """Compare a received buffer or object with ``want``; remember a difference."""
        error = mismatch(np.asarray(got), want, what)
        if error:
            self.count += 1
            self.first = self.first or error


def setup(name: str, title: str, *, iters: tuple[int, int, int, int], sizes: tuple[int, int],
          min_ranks: int, columns: list[tuple[str, str, int, str]],
          add_args: Callable[[argparse.ArgumentParser], None] | None = None,
          argv: list[str] | None = None, even: bool = False) -> P2P | int:
    """Parse options and start the communicator; return the run, or an exit status."""
    i, x, il, xl = iters
    p = make_parser(title, iters=i, warmup=x, iters_large=il, warmup_large=xl)
    p.set_defaults(dtype="uint8")
    p.add_argument("--pickle", action="store_true",
                   help="object messages: lowercase send/recv/isend of numpy arrays")
    if add_args:
        add_args(p)
    args = p.parse_args(argv)
    c = select_comm(args.mpi4py)
    check_transport(c, args.transport)
    if c.size < min_ranks or (even and c.size % 2):
        if c.rank == 0:
            print(f"osu_{name} needs {'an even number of' if even else 'at least'} "
                  f"{min_ranks} ranks", file=sys.stderr)
        return 2
    dtype = np.dtype(args.dtype)
    lst = [s for s in sizes_from_args(args, *sizes) if s == 0 or s >= dtype.itemsize]
    cols = list(columns)
    if args.full:
        key, title_, width, fmt = columns[1]
        unit = title_.split("(")[-1]
        base = title_.replace("Avg ", "").split("(")[0].strip()
        cols += [(key.replace("avg_", "min_").replace("bandwidth", "min_bandwidth"),
                  f"Min {base}({unit}", width, fmt),
                 (key.replace("avg_", "max_").replace("bandwidth", "max_bandwidth"),
                  f"Max {base}({unit}", width, fmt),
                 ("iterations", "Iterations", 12, "d")]
    meta = run_metadata(c, f"osu_{name}", algorithm="-", dtype=dtype.name,
                        pickle=args.pickle, validate=args.validate)
    report = Report(title, c.label, cols, enabled=c.rank == 0, meta=meta)
    notes = [f"{c.size} ranks, {dtype.name}"
             + (", object messages (pickle)" if args.pickle else ", buffers")
             + (", validating" if args.validate else "")]
    return P2P(args, c, lst, report, Pattern(dtype), dtype, notes)


def sweep(run: P2P, make_one: Callable[[int], Callable[[int], None]],
          row: Callable[[int, float, list[float] | None, int], tuple | None],
          checker: Checker) -> int:
    """Run every size: ``make_one(count)`` gives ``one(it)``; ``row`` turns timings into a row.

    ``row(size, total_seconds, per_iteration_seconds_or_None, iters)`` runs on every rank
    and returns the row's values (rank 0) or None. Returns the exit status (1: validation).
    """
    args, c = run.args, run.c
    per_iter = args.full or args.validate
    wtime, comm = c.mod.Wtime, c.comm
    progress = Progress(run.report.meta["benchmark"], len(run.sizes),
                        c.rank == 0 and not args.quiet)
    failed = False
    run.report.header(*run.notes)
    for size in run.sizes:
        one = make_one(size // run.dtype.itemsize)
        iters, warmup = loop_counts(args, size)
        comm.Barrier()
        t0 = wtime()
        for it in range(warmup):
            one(it)
        warm = wtime() - t0
        if args.max_time is not None:
            iters = agree_iterations(c, iters, warm, warmup, args.max_time)
        comm.Barrier()
        times: list[float] | None = [] if per_iter else None
        if per_iter:
            for it in range(warmup, warmup + iters):
                t0 = wtime()
                one(it)
                times.append(wtime() - t0)
            total = sum(times)
        else:
            t0 = wtime()
            for it in range(warmup, warmup + iters):
                one(it)
            total = wtime() - t0
        comm.Barrier()
        values = row(size, total, times, iters)
        bad = comm.gather((checker.count, checker.first), root=0)
        checker.count, checker.first = 0, None
        if c.rank == 0:
            for r, (count, first) in enumerate(bad):
                if count:
                    failed = True
                    print(f"# VALIDATION FAILED at {size} B on rank {r}: {count} wrong "
                          f"message(s); {first}", file=sys.stderr, flush=True)
            if values is not None:
                run.report.row(*values[:len(run.report.columns)],
                               **({"iterations": iters} if not args.full else {}))
        progress.step(f"{size} B")
    run.report.write(args.json, args.csv)
    failed = bool(comm.bcast(failed, root=0))
    return 1 if failed else 0


def stats_cols(full: bool, values: list[float], convert: Callable[[float], float],
               iters: int) -> list:
    """The -f columns: min and max of ``convert(per-iteration seconds)``, iterations."""
    if not full or not values:
        return []
    conv = [convert(v) for v in values]
    return [min(conv), max(conv), iters]
