"""The collective benchmarks' shared body: a benchmark is a :class:`Collective` spec.

A spec names the call (``"Allreduce"``, and ``"Iallreduce"`` for the nonblocking twin),
the registry name of ``pycomm.algorithms(...)``, how a size in bytes becomes an element
count, and a ``setup(ctx, count)`` that builds the buffers and returns a :class:`Case`:
the call's arguments, a ``fill(it)`` that writes iteration ``it``'s inputs (and spoils the
outputs) and a ``check(it)`` that compares the outputs with numpy's answer. A script is
then a docstring, a setup function and ``sys.exit(run(SPEC))``.

Blocking timing (OSU's): per size, ``-x`` warm-up then ``-i`` timed iterations; each rank
times each call with ``Wtime`` and a Barrier (untimed) follows every call, so iterations
do not pipeline. The row gives the average, minimum and maximum over ranks of the per-rank
mean, and nccl-tests' algbw = S / avg and busbw = algbw * factor(n) in GB/s (10**9 B/s),
S being the bytes nccl-tests counts (see ``_common.BUSBW_FACTORS``).

Nonblocking timing (OSU's ``osu_i*``): first the pure communication time (post + Wait);
then, per iteration, post, a compute of that duration (the largest per-rank mean, agreed
by every rank), Wait. Columns: Overall (post to Wait's return), Compute (the compute's own
measured time), Pure Comm., and Overlap = max(0, 100 * (1 - (Overall - Compute) / Pure)),
all averaged over ranks. ``--compute sleep`` (the default) sleeps, leaving the CPU as an
accelerator kernel or I/O would; ``--compute busy`` is OSU's CPU-bound loop (numpy).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from _common import (
    Comm,
    Pattern,
    Progress,
    Report,
    agree_iterations,
    busbw_factor,
    check_transport,
    loop_counts,
    make_parser,
    run_metadata,
    select_comm,
    sizes_from_args,
    summarize,
)

__all__ = [
    "Case",
    "Collective",
    "Ctx",
    "compute_busy",
    "compute_sleep",
    "main",
    "overlap_percent",
    "run",
]


@dataclass
class Ctx:
    """What a setup function needs: the communicator, dtype, data pattern and root."""

    c: Comm
    dtype: np.dtype
    pattern: Pattern
    root: int = 0

    @property
    def n(self) -> int:
        return self.c.size

    @property
    def rank(self) -> int:
        return self.c.rank

    def empty(self, count: int) -> np.ndarray:
        """A zeroed buffer of ``count`` elements (zero is never a valid result)."""
        return np.zeros(count, dtype=self.dtype)


@dataclass
class Case:
    """One size's call: ``method(*args, **kwargs)``; ``fill``/``check`` for validation.

    ``fill(it)`` writes iteration ``it``'s inputs and spoils the outputs; ``check(it)``
    returns None when the outputs are numpy's answer, else what is wrong.
    """

    args: tuple
    kwargs: dict = field(default_factory=dict)
    fill: Callable[[int], None] = lambda it: None
    check: Callable[[int], str | None] = lambda it: None


@dataclass
class Collective:
    """A collective benchmark.

    Args:
        name: benchmark name without ``osu_`` (``"allreduce"``, ``"iallreduce"``).
        method: the communicator method timed (``"Allreduce"``, ``"Iallreduce"``).
        title: OSU's title, e.g. ``"OSU MPI Allreduce Latency Test"``.
        setup: ``setup(ctx, count) -> Case``.
        registry: name in ``pycomm.algorithms()`` (``"reduce_scatter_block"``), or None.
        per_rank: the size is per rank or per peer (allgather, alltoall, gather, scatter):
            nccl-tests' S is n times the size.
        divide: the size is the whole buffer that is split n ways (reduce_scatter): the
            count is size / itemsize / n per rank.
        size_note: what a size means, printed in the header.
        sizes: default (MIN, MAX) bytes; None for barrier (one row, size 0).
        nonblocking: time post + compute + Wait (``method`` returns a Request).
        iters: (iterations, warm-up, large iterations, large warm-up) defaults.
    """

    name: str
    method: str
    title: str
    setup: Callable[[Ctx, int], Case]
    registry: str | None = None
    per_rank: bool = False
    divide: bool = False
    size_note: str = "size: bytes of each rank's buffer"
    sizes: tuple[int, int] | None = (4, 1 << 20)
    nonblocking: bool = False
    iters: tuple[int, int, int, int] = (1000, 100, 100, 10)

    def count(self, size: int, n: int, itemsize: int) -> int:
        """Elements per block for a size in bytes (0: the size is skipped)."""
        return size // itemsize // (n if self.divide else 1)

    def algbw_bytes(self, size: int, n: int) -> int:
        """nccl-tests' S: the bytes algbw counts for one call."""
        return size * n if self.per_rank else size


def nonblocking(blocking: Collective) -> Collective:
    """Return the nonblocking twin of a blocking spec (OSU's ``osu_i<name>``).

    The twin times ``I<method>`` on the blocking spec's buffers (same sizes, same ``-c``
    checks) with the compute overlap described at the top of this module; a spec with
    no sizes (barrier) runs 1000 iterations at its single size, as OSU's ``osu_ibarrier``.

    Args:
        blocking: the spec of the blocking script (``osu_allreduce.SPEC``).

    Returns:
        A new spec named ``"i" + blocking.name`` timing ``"I" + <method, lowercased first
        letter>`` (``Allreduce`` -> ``Iallreduce``).
    """
    method = "I" + blocking.method[0].lower() + blocking.method[1:]
    return replace(blocking, name="i" + blocking.name, method=method, nonblocking=True,
                   title=blocking.title.replace("MPI ", "MPI Non-blocking "),
                   iters=(1000, 100, 100, 10) if blocking.sizes else (1000, 100, 1000, 100))

# -- compute for the nonblocking benchmarks ----------------------------------------------

def compute_sleep(seconds: float) -> None:
    """Wait ``seconds`` off the CPU, as a rank does while an accelerator or I/O works."""
    if seconds > 0:
        time.sleep(seconds)


_BUSY = np.ones(4096, dtype=np.float64)


def compute_busy(seconds: float) -> None:
    """Keep the CPU busy for ``seconds`` with numpy arithmetic (OSU's dummy compute)."""
    end = time.perf_counter() + seconds
    x = _BUSY
    while time.perf_counter() < end:
        np.multiply(x, 1.0000001, out=x)
        np.sqrt(x, out=x)


def overlap_percent(overall: float, compute: float, pure: float) -> float:
    """OSU's overlap: 100 * (1 - (overall - compute) / pure), clipped to [0, 100]."""
    if pure <= 0:
        return 0.0
    return max(0.0, min(100.0, 100.0 * (1.0 - (overall - compute) / pure)))


# -- the loops ---------------------------------------------------------------------------

class _Errors:
    """Validation failures of this rank (only the first few are kept)."""

    def __init__(self):
        self.items: list[str] = []
        self.count = 0

    def add(self, text: str | None) -> None:
        if text:
            self.count += 1
            if len(self.items) < 3:
                self.items.append(text)


def _blocking(c: Comm, case: Case, call: Callable, iters: int, first: int, validate: bool,
              errors: _Errors, barrier: bool) -> float:
    """Time ``iters`` calls; return the seconds spent inside them on this rank."""
    wtime, comm = c.mod.Wtime, c.comm
    total = 0.0
    for it in range(first, first + iters):
        if validate:
            case.fill(it)
        t0 = wtime()
        call()
        total += wtime() - t0
        if validate:
            errors.add(case.check(it))
        if barrier:
            comm.Barrier()
    return total


def _overlapped(c: Comm, case: Case, post: Callable, iters: int, first: int, validate: bool,
                errors: _Errors, compute: Callable[[float], None] | None,
                seconds: float) -> tuple[float, float]:
    """Time ``iters`` of post [+ compute] + Wait; return (overall, compute) seconds."""
    wtime, comm = c.mod.Wtime, c.comm
    overall = busy = 0.0
    for it in range(first, first + iters):
        if validate:
            case.fill(it)
        t0 = wtime()
        req = post()
        if compute is not None:
            t1 = wtime()
            compute(seconds)
            busy += wtime() - t1
        req.Wait()
        overall += wtime() - t0
        if validate:
            errors.add(case.check(it))
        comm.Barrier()
    return overall, busy


def _algorithm_names(spec: Collective, c: Comm, wanted: str | None) -> list[str | None]:
    """The algorithms to run: [None] (automatic), one name, or every name then auto."""
    if wanted is None:
        return [None]
    if wanted != "all":
        return [wanted]
    try:
        names: list[str | None] = list(c.mod.algorithms(spec.registry))
    except Exception:  # noqa: BLE001  (mpi4py, or a collective without a registry entry)
        names = []
    return names + ["auto"]


def _auto_choice(c: Comm, spec: Collective, size: int) -> str | None:
    """The algorithm pycomm's model picks for this size (None when it cannot be asked)."""
    if c.name != "pycomm" or not spec.registry:
        return None
    try:
        return c.comm.chosen_algorithm(spec.registry, spec.algbw_bytes(size, c.size),
                                       algorithm="auto")
    except Exception:  # noqa: BLE001  (the label is informative only)
        return None


def _parser(spec: Collective):
    i, x, il, xl = spec.iters
    p = make_parser(spec.title, iters=i, warmup=x, iters_large=il, warmup_large=xl)
    p.add_argument("--algorithm", default=None, metavar="NAME|all",
                   help="pycomm only: algorithm=NAME on every call; 'all' runs each of "
                        "pycomm.algorithms() and the automatic choice side by side")
    p.add_argument("--root", type=int, default=0, help="root rank where there is one")
    p.add_argument("--rounds", type=int, default=1, metavar="R",
                   help="measure every (size, algorithm) R times, the algorithms taking "
                        "turns (in reverse order every other round), and report the round "
                        "with the lowest average (steadies "
                        "side-by-side comparisons on a noisy machine; default 1)")
    if spec.nonblocking:
        p.add_argument("--compute", choices=("sleep", "busy"), default="sleep",
                       help="dummy compute: sleep (off the CPU, default) or busy (OSU's "
                            "CPU-bound loop)")
    return p


def run(spec: Collective, argv: list[str] | None = None) -> int:
    """Parse ``argv``, run every size (and algorithm), print rows on rank 0; exit status."""
    args = _parser(spec).parse_args(argv)
    if args.rounds < 1:
        print(f"--rounds must be at least 1, not {args.rounds}", file=sys.stderr)
        return 2
    if args.mpi4py and args.algorithm:
        print("--algorithm is a pycomm keyword; mpi4py has none", file=sys.stderr)
        return 2
    c = select_comm(args.mpi4py)
    check_transport(c, args.transport)
    n, dtype = c.size, np.dtype(args.dtype)
    if not 0 <= args.root < n:
        if c.rank == 0:
            print(f"--root {args.root} is not a rank of {n}", file=sys.stderr)
        return 2
    ctx = Ctx(c, dtype, Pattern(dtype), args.root)
    sizes = [0] if spec.sizes is None else \
        [s for s in sizes_from_args(args, *spec.sizes) if spec.count(s, n, dtype.itemsize) > 0]
    algos = _algorithm_names(spec, c, args.algorithm)
    side_by_side = len(algos) > 1
    factor = busbw_factor(spec.registry or spec.name, n)
    cols = _columns(spec, args.full, side_by_side, algos, factor)
    report = Report(spec.title, c.label, cols, enabled=c.rank == 0,
                    meta=run_metadata(c, f"osu_{spec.name}", algorithm=args.algorithm,
                                      dtype=dtype.name, op="SUM", root=args.root,
                                      validate=args.validate, rounds=args.rounds,
                                      compute=getattr(args, "compute", None)))
    notes = [f"{n} ranks, {dtype.name}" + (", SUM" if "reduce" in spec.name
                                           or "scan" in spec.name else "")
             + f", algorithm {args.algorithm or 'auto'}"
             + (f", root {args.root}" if "root" in _kw_names(spec) else ""),
             spec.size_note]
    if factor is not None:
        notes.append(f"algbw = S/t with S = {'n x size' if spec.per_rank else 'size'}; "
                     f"busbw = algbw x {factor:.4g} (nccl-tests)")
    if spec.nonblocking:
        notes.append(f"compute: {args.compute}")
    if side_by_side:
        notes.append("avg latency (us) per algorithm; auto = pycomm's choice")
    report.header(*notes)
    progress = Progress(f"osu_{spec.name}", len(sizes) * len(algos) * args.rounds,
                        c.rank == 0 and not args.quiet)
    compute = compute_busy if getattr(args, "compute", "") == "busy" else compute_sleep
    errors = _Errors()
    failed = False
    for size in sizes:
        count = spec.count(size, n, dtype.itemsize)
        case = spec.setup(ctx, count)
        case.fill(0)
        iters, warmup = loop_counts(args, size)
        cells: dict[str | None, Any] = {}
        for rnd in range(args.rounds):
            # alternate the order, so that no algorithm always runs right after the same
            # neighbour (caches, page state and the scheduler's placement carry over)
            for algo in (algos if rnd % 2 == 0 else algos[::-1]):
                kw = dict(case.kwargs)
                if algo is not None:
                    kw["algorithm"] = algo
                fn = getattr(c.comm, spec.method)
                call = lambda: fn(*case.args, **kw)  # noqa: B023
                result = _one(spec, c, args, case, call, iters, warmup, errors, compute)
                cells[algo] = _better(cells.get(algo), result)
                progress.step(f"{size} B" + (f" {algo}" if algo else ""))
        failed |= _report_errors(c, errors, size)
        if c.rank == 0:
            _emit(report, spec, c, size, cells, side_by_side, args.full, factor)
    report.write(args.json, args.csv)
    failed = bool(c.comm.bcast(failed, root=0))
    return 1 if failed else 0


def _better(old: dict | None, new: dict | None) -> dict | None:
    """Of two measurements of one (size, algorithm), the one with the lower average."""
    if old is None or "stats" not in old:
        return new if new is not None else old
    if new is None or "stats" not in new:
        return old
    return new if new["stats"].avg < old["stats"].avg else old


def _kw_names(spec: Collective) -> set[str]:
    return {"root"} if spec.name.lstrip("i") in {"bcast", "reduce", "gather", "scatter",
                                                 "gatherv", "scatterv"} else set()


def _one(spec, c, args, case, call, iters, warmup, errors, compute) -> dict | None:
    """Measure one (size, algorithm); rank 0 gets the summary dict, others None."""
    comm = c.comm
    barrier = spec.name != "barrier"
    try:
        c.comm.Barrier()
        if spec.nonblocking:
            warm, _ = _overlapped(c, case, call, warmup, 0, args.validate, errors, None, 0)
        else:
            warm = _blocking(c, case, call, warmup, 0, args.validate, errors, barrier)
    except Exception as exc:  # noqa: BLE001  (an algorithm that cannot serve this call)
        c.comm.Barrier()
        return {"error": f"{type(exc).__name__}: {exc}"} if c.rank == 0 else None
    if args.max_time is not None:
        iters = agree_iterations(c, iters, warm, warmup, args.max_time)
    comm.Barrier()
    if not spec.nonblocking:
        t = _blocking(c, case, call, iters, warmup, args.validate, errors, barrier) / iters
        means = comm.gather(t, root=0)
        return {"stats": summarize(means, iters)} if c.rank == 0 else None
    pure, _ = _overlapped(c, case, call, iters, warmup, args.validate, errors, None, 0)
    pure /= iters
    target = comm.allreduce(pure, op=c.mod.MAX)
    comm.Barrier()
    overall, busy = _overlapped(c, case, call, iters, warmup + iters, args.validate, errors,
                                compute, target)
    got = comm.gather((overall / iters, busy / iters, pure), root=0)
    if c.rank != 0:
        return None
    o, b, p = (sum(g[k] for g in got) / len(got) for k in range(3))
    return {"stats": summarize([g[0] for g in got], iters), "overall": o, "compute": b,
            "pure": p, "overlap": overlap_percent(o, b, p)}


def _report_errors(c: Comm, errors: _Errors, size: int) -> bool:
    """Gather this size's validation failures to rank 0, print them; True when any."""
    all_errors = c.comm.gather((errors.count, errors.items), root=0)
    errors.items, errors.count = [], 0
    if c.rank != 0:
        return False
    bad = False
    for rank, (count, items) in enumerate(all_errors):
        if count:
            bad = True
            print(f"# VALIDATION FAILED at {size} B on rank {rank}: {count} wrong "
                  f"iteration(s); {items[0]}", file=sys.stderr, flush=True)
    return bad


def _columns(spec, full, side_by_side, algos, factor):
    cols: list[tuple[str, str, int, str]] = [("size", "Size", 10, "d")]
    if side_by_side:
        for a in algos:
            cols.append((f"{a}_us", f"{a}(us)", max(12, len(a) + 6), ".2f"))
        cols.append(("auto_choice", "auto=", 22, "s"))
        return cols
    if spec.nonblocking:
        cols += [("overall_us", "Overall(us)", 14, ".2f"), ("compute_us", "Compute(us)", 14,
                 ".2f"), ("pure_comm_us", "Pure Comm.(us)", 16, ".2f"),
                 ("overlap_pct", "Overlap(%)", 12, ".2f")]
    else:
        cols.append(("avg_us", "Avg Latency(us)", 17, ".2f"))
    if full:
        name = "Overall" if spec.nonblocking else "Latency"
        cols += [("min_us", f"Min {name}(us)", 17, ".2f"),
                 ("max_us", f"Max {name}(us)", 17, ".2f"), ("iterations", "Iterations", 12, "d")]
    if spec.sizes is not None:
        cols.append(("algbw_gbps", "algbw(GB/s)", 13, ".4f"))
        if factor is not None:
            cols.append(("busbw_gbps", "busbw(GB/s)", 13, ".4f"))
    return cols


def _emit(report, spec, c, size, cells, side_by_side, full, factor) -> None:
    """Print one size's row (or side-by-side row) and record every measurement."""
    n = c.size
    for algo, cell in cells.items():
        rec = {"size": size, "algorithm": algo or report.meta.get("algorithm")}
        if cell is None or "error" in cell:
            rec["error"] = cell["error"] if cell else "no result"
        else:
            s = cell["stats"]
            rec.update(avg_us=s.avg * 1e6, min_us=s.min * 1e6, max_us=s.max * 1e6,
                       iterations=s.iterations)
            if spec.nonblocking:
                rec.update(overall_us=cell["overall"] * 1e6, compute_us=cell["compute"] * 1e6,
                           pure_comm_us=cell["pure"] * 1e6, overlap_pct=cell["overlap"])
            t = cell["pure"] if spec.nonblocking else s.avg
            if spec.sizes is not None and t > 0:
                rec["algbw_gbps"] = spec.algbw_bytes(size, n) / t / 1e9
                if factor is not None:
                    rec["busbw_gbps"] = rec["algbw_gbps"] * factor
        if algo == "auto" or (not side_by_side and algo is None):
            rec["auto_choice"] = _auto_choice(c, spec, size)
        if side_by_side:
            report.record(**rec)
        else:
            report.rows.append(rec)
            report.line(report.format_row([rec.get(k) for k, _, _, _ in report.columns])
                        if "error" not in rec else f"{size:<10d}  {rec['error']}")
    if side_by_side:
        values = [size] + [cells[a]["stats"].avg * 1e6 if cells[a] and "stats" in cells[a]
                           else None for a in cells]
        values.append(_auto_choice(c, spec, size) or "-")
        report.line(report.format_row(values))
        for a, cell in cells.items():
            if cell and "error" in cell:
                report.line(f"#   {a} at {size} B: {cell['error']}")


def main(spec: Collective) -> None:
    """Entry point of a collective script: ``main(SPEC)`` exits with :func:`run`'s status."""
    sys.exit(run(spec))
