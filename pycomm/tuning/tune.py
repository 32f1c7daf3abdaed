"""Measure the cost model's constants on this machine: ``python -m pycomm.tuning.tune``.

Usage::

    python -m pycomm.tuning.tune [-n 2] [--transport shm|tcp|rdma|all] [--out FILE] [--quick]

Writes the JSON table that :mod:`pycomm.tuning.cost` reads (to stdout, or ``FILE``)::

    {"shm": {"alpha": s, "beta": s/B, "alpha_rndv": s, "beta_rndv": s/B, "alpha_x": s,
             "gamma": s/B, "sigma": s/B, "wake": s, "wake_x": {ranks per core: s},
             "lanes": {bytes: copies}},
     "tcp": {...}, "rdma": {...},
     "source": {"date", "host", "cpu_count", "python", "numpy", "pycomm", "command",
                "loadavg", "ranks", "eager_limit", "points"}}

Point ``PYCOMM_TUNE_FILE`` at the file to use it instead of the shipped table
(``pycomm/tuning/tuned.json``, measured the same way). What is measured:

* **α, β, α_rndv, β_rndv** per transport: ranks started with :func:`pycomm.spawn`; ranks 0
  and 1 ping-pong ``Send``/``Recv`` messages (the others wait), one-way time = round trip
  / 2, the median of several timed loops per size. α is the intercept of the
  least-squares line ``t = α + mβ'`` over small messages (8 B .. 4 KiB: latency, Python
  overhead included), β the slope over 4 .. 64 KiB (eager protocol: copied through the
  transport); α_rndv and β_rndv are intercept and slope of the line over the sizes past
  ``PYCOMM_EAGER_LIMIT`` up to 8 MiB (rendezvous: handshake and one copy), fitted on
  relative residuals (the times span two decades, and per-byte cost grows past the
  caches: an absolute fit lets 4-8 MiB set an intercept three times the measured one).
* **α_x**: an exchange step, ranks 0 and 1 each ``Sendrecv`` to the other at once (as in
  a ring or recursive-doubling step), intercept over 8 B .. 4 KiB. A rank makes two
  message calls in such a step where the ping-pong prices one; the model charges an
  exchange step ``α_x`` where a one-way step pays ``α``.
* **wake** and **wake_x**: what a step pays per turn of the cores when ranks outnumber
  them: a one-way hop of a token ring over twice as many ranks as cores
  (:func:`measure_wake`), and an exchange step of dissemination rounds over two and four
  times as many (:func:`measure_exchange_wake`).
* **γ**: seconds per byte of ``SUM.apply`` (an in-place ``np.add``) on float32 and
  float64 arrays of 256 KiB .. 16 MiB, least-squares slope; the table keeps the larger of
  the two (the model has one γ).
* **σ**: seconds per byte of fresh scratch: ``np.empty`` + copy minus a copy into a
  reused buffer, least-squares slope over the same sizes.
* **lanes**: how many copies of 256 KiB .. 16 MiB the memory system runs at full speed at
  once: one rank per core (at most 16) copies buffers of each size, 1, 2, ... of them at
  once; the best aggregate rate over one copy's (:func:`measure_lanes`).

γ, σ and the lanes are properties of the CPU, not of the transport: every transport gets
the same.
The numbers are only as good as the machine is quiet: ``source.loadavg`` records the
load when the run started, so a table measured under load says so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time
from typing import Any

import numpy as np

from pycomm.waiting import available_cores

__all__ = ["fit_line", "measure_pingpong", "measure_wake", "measure_exchange_wake",
           "measure_gamma", "measure_sigma", "measure_lanes", "tune", "main"]

SMALL = [8, 64, 512, 4096]                        # bytes: α fit
EAGER = [4096, 16384, 65536]                      # bytes: β fit (eager protocol)
LARGE = [1 << 17, 1 << 18, 1 << 19, 1 << 20, 2 << 20, 4 << 20, 8 << 20]  # rendezvous fit
COMPUTE = [256 << 10, 1 << 20, 4 << 20, 16 << 20]  # bytes: γ and σ fits
LANES = [256 << 10, 1 << 20, 4 << 20, 16 << 20]    # bytes: concurrent copies (lanes)


def fit_line(xs: list[float], ys: list[float], *, relative: bool = False
             ) -> tuple[float, float]:
    """Least-squares line through ``(xs, ys)``: return ``(intercept, slope)``.

    Args:
        relative: minimise relative rather than absolute residuals (each point weighted
            by ``1 / y``): for sizes spanning decades, so that the largest do not decide
            the intercept alone.

    Raises:
        ValueError: fewer than two distinct ``xs``.
    """
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("a line needs at least two distinct sizes")
    w = 1.0 / np.abs(y) if relative and np.all(y != 0) else np.ones_like(y)
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (intercept, slope), *_ = np.linalg.lstsq(design, y * w, rcond=None)
    return float(intercept), float(slope)


def _iterations(nbytes: int, quick: bool) -> int:
    budget = 2e6 if quick else 5e7  # bytes moved per timed loop: long enough to time
    return int(min(200 if quick else 1000, max(3, budget // max(nbytes, 1))))


def _per_unit(comm, run, reps: int) -> float:
    """Median seconds per unit of ``run()`` (which returns how many units it did) over
    ``reps`` timed calls, each after a barrier, the first call a warm-up (connections,
    pages)."""
    samples = []
    for rep in range(reps + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        units = run()
        if rep:
            samples.append((time.perf_counter() - t0) / units)
    return statistics.median(samples)


def _pingpong_rank(sizes: list[int], reps: int, quick: bool) -> dict[int, float] | None:
    """Run on every rank of a spawned world; rank 0 returns one-way seconds per size."""
    import pycomm

    comm = pycomm.COMM_WORLD
    peer = 1 - comm.rank  # ranks 0 and 1 time; the others only meet the barriers
    result = {}
    for nbytes in sizes:
        buf = np.zeros(nbytes, dtype=np.uint8)
        iters = _iterations(nbytes, quick)

        def pingpong(buf=buf, iters=iters) -> int:
            for _ in range(iters if comm.rank < 2 else 0):
                if comm.rank == 0:
                    comm.Send(buf, 1)
                    comm.Recv(buf, 1)
                else:
                    comm.Recv(buf, 0)
                    comm.Send(buf, 0)
            return 2 * iters  # one-way trips
        result[nbytes] = _per_unit(comm, pingpong, reps)
    # exchanges: ranks 0 and 1 send to and receive from each other in every step, as a
    # ring or recursive-doubling step does
    exchange = {}
    for nbytes in SMALL:
        out, into = np.zeros(nbytes, dtype=np.uint8), np.zeros(nbytes, dtype=np.uint8)
        iters = _iterations(nbytes, quick)

        def swap(out=out, into=into, iters=iters) -> int:
            for _ in range(iters if comm.rank < 2 else 0):
                comm.Sendrecv(out, peer, recvbuf=into, source=peer)
            return iters
        exchange[nbytes] = _per_unit(comm, swap, reps)
    comm.Barrier()
    return (result, exchange) if comm.rank == 0 else None


def measure_pingpong(transport: str, nprocs: int = 2, *, quick: bool = False
                     ) -> tuple[dict[str, float], dict[int, float]]:
    """Fit both protocols' lines to ping-pong times of ``transport``.

    Args:
        transport: "shm", "tcp" or "rdma".
        nprocs: ranks to start (>= 2; only ranks 0 and 1 exchange messages).
        quick: fewer iterations (for tests); the fit is then rough.

    Returns:
        ``({"alpha", "beta", "alpha_rndv", "beta_rndv", "alpha_x"}, {bytes: one-way
        seconds})``: α the intercept over 8 B .. 4 KiB, β the slope over 4 .. 64 KiB
        (eager messages), α_rndv and β_rndv intercept and slope over the sizes above
        ``PYCOMM_EAGER_LIMIT`` up to 8 MiB (rendezvous messages); α_x the intercept over
        8 B .. 4 KiB of an exchange step (``Sendrecv`` both ways at once; at least α).

    Raises:
        ValueError: ``nprocs < 2``, or an eager limit that leaves fewer than two sizes on
            either side.
        CommError: the ranks could not be started or failed.
    """
    from pycomm import config
    from pycomm.launch.spawning import spawn

    if nprocs < 2:
        raise ValueError(f"pycomm.tuning.tune needs at least 2 ranks, got -n {nprocs}")
    limit = config.get("PYCOMM_EAGER_LIMIT")
    eager = [m for m in EAGER if m <= limit]
    rndv = [m for m in LARGE if m > limit]
    if len(eager) < 2 or len(rndv) < 2:
        raise ValueError(f"PYCOMM_EAGER_LIMIT={limit} leaves too few sizes to fit: eager "
                         f"{eager}, rendezvous {rndv} (needs 16 KiB .. 2 MiB)")
    sizes = sorted(set(SMALL + eager + rndv))
    times, exchange = spawn(_pingpong_rank, nprocs, (sizes, 2 if quick else 5, quick),
                            transport=transport)[0]
    alpha, _ = fit_line(SMALL, [times[m] for m in SMALL])
    alpha_x, _ = fit_line(SMALL, [exchange[m] for m in SMALL])
    _, beta = fit_line(eager, [times[m] for m in eager])
    alpha_rndv, beta_rndv = fit_line(rndv, [times[m] for m in rndv], relative=True)
    # A noisy fit can cross zero; fall back to the measured latency / time per byte.
    fit = {"alpha": alpha if alpha > 0 else min(times[m] for m in SMALL),
           "beta": beta if beta > 0 else times[eager[-1]] / eager[-1],
           "alpha_rndv": alpha_rndv if alpha_rndv > 0 else times[rndv[0]],
           "beta_rndv": beta_rndv if beta_rndv > 0 else times[rndv[-1]] / rndv[-1]}
    # an exchange step costs at least one message's latency
    fit["alpha_x"] = max(alpha_x, fit["alpha"])
    return fit, times


def _token_ring_rank(rounds: int) -> float | None:
    """Pass an 8-byte token around all ranks ``rounds`` times; rank 0 returns s per hop."""
    import pycomm

    comm = pycomm.COMM_WORLD
    p, r = comm.size, comm.rank
    buf = np.zeros(1, dtype=np.float64)

    def ring() -> int:
        for _ in range(rounds):
            if r == 0:
                comm.Send(buf, 1 % p)
                comm.Recv(buf, p - 1)
            else:
                comm.Recv(buf, r - 1)
                comm.Send(buf, (r + 1) % p)
        return rounds * p  # hops
    per_hop = _per_unit(comm, ring, 3)
    return per_hop if r == 0 else None


def measure_wake(transport: str, alpha: float, *, quick: bool = False) -> float:
    """Extra seconds per message when a host's ranks outnumber its cores (2 per core).

    Each hop of a token ring then waits for a waiting rank (yielding its core, or asleep
    once its yielding phase is over: :mod:`pycomm.waiting`) to be scheduled;
    ``wake`` = measured seconds per hop - ``alpha`` (never negative). The median of three
    worlds, each started afresh: where the scheduler places the ranks is fixed for a
    world's life and moves the figure (how much: benchmarks/README.md, "Measurements
    behind design choices in the code").
    """
    from pycomm.launch.spawning import spawn

    cores = available_cores()
    hops = [spawn(_token_ring_rank, 2 * cores, (50 if quick else 300,),
                  transport=transport)[0] for _ in range(1 if quick else 3)]
    return max(0.0, statistics.median(hops) - alpha)


def _exchange_rank(rounds: int) -> float | None:
    """Every rank, at step ``k`` of a round, sends 8 bytes to ``rank + 2^k`` and receives
    from ``rank - 2^k`` at once (a dissemination round: every rank exchanges in every step,
    as in a ring or recursive-doubling step); rank 0 returns seconds per step."""
    import pycomm

    comm = pycomm.COMM_WORLD
    p, r = comm.size, comm.rank
    out, into = np.zeros(1, dtype=np.float64), np.zeros(1, dtype=np.float64)

    def disseminate() -> int:
        steps = 0
        for _ in range(rounds):
            d = 1
            while d < p:
                comm.Sendrecv(out, (r + d) % p, recvbuf=into, source=(r - d) % p)
                d *= 2
                steps += 1
        return steps
    per_step = _per_unit(comm, disseminate, 3)
    return per_step if r == 0 else None


def measure_exchange_wake(transport: str, alpha_x: float, *,
                          quick: bool = False) -> dict[float, float]:
    """Seconds an exchange step pays per turn of the cores when ranks outnumber them.

    ``o`` ranks per core (``o`` = 2 and, up to 64 ranks, 4) run dissemination rounds of
    8-byte exchanges (:func:`_exchange_rank`); per step every rank needs the core once
    and its partners must each have run, so a step takes ``α_x + o · wake_x``:
    ``wake_x = (step - α_x) / o``, the median of three worlds. A one-way hop of the token
    ring (``wake``) hands the core over once, where a waiting rank is scheduled about
    twice per exchange (measured: benchmarks/README.md, "Measurements behind design
    choices in the code").

    Returns:
        ``{ranks per core: seconds per turn}`` (the cost model's ``wake_x``).
    """
    from pycomm.launch.spawning import spawn

    cores = available_cores()
    out = {}
    for o in (2, 4):
        if o > 2 and (quick or o * cores > 64):
            break
        steps = [spawn(_exchange_rank, o * cores, (30 if quick else 150,),
                       transport=transport)[0] for _ in range(1 if quick else 3)]
        out[float(o)] = max(0.0, statistics.median(steps) - alpha_x) / o
    return out


def _lanes_rank(sizes: list[int], volume: int) -> dict[int, float] | None:
    """Run on every rank: for ``m = 1 .. size``, ranks ``0 .. m-1`` each copy ``volume``
    bytes in buffers of each size at once; rank 0 returns ``{bytes: the most concurrent
    copies' aggregate rate / one copy's}``."""
    import pycomm

    comm = pycomm.COMM_WORLD
    out = {}
    for nbytes in sizes:
        src = np.ones(nbytes, dtype=np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)                       # fault the pages in
        reps = max(2, volume // nbytes)
        rates = []
        for m in range(1, comm.size + 1):
            samples = []
            for _ in range(5):
                comm.Barrier()
                t0 = time.perf_counter()
                if comm.rank < m:
                    for _ in range(reps):
                        np.copyto(dst, src)
                took = time.perf_counter() - t0 if comm.rank < m else 0.0
                samples.append(max(comm.allgather(took)))   # the slowest copier
            rates.append(m * reps * nbytes / statistics.median(samples))
        out[nbytes] = max(rates) / rates[0]
    return out if comm.rank == 0 else None


def measure_lanes(*, quick: bool = False) -> dict[int, float]:
    """How many large copies the memory system runs at full speed at once.

    One rank per core (at most 16) copies a buffer of each size in :data:`LANES`; for
    ``m = 1 .. cores`` ranks copying at once, the aggregate rate over one copy's rate; the
    most over ``m`` is the size's *lanes* (the median of three worlds). On the 2-core VM
    here two 16 MiB copies run only 1.0-1.6x as fast together as one alone (memory-bound),
    while two 256 KiB copies run side by side in their cores' caches (2.0). The cost model
    divides concurrent copies and reductions of a step by ``min(cores, lanes)`` rather
    than by the cores alone.

    Returns:
        ``{bytes: lanes}`` (each from 1 to the ranks started).
    """
    from pycomm.launch.spawning import spawn

    cores = available_cores()
    cores = max(1, min(cores, 16))
    if cores == 1:
        return {m: 1.0 for m in LANES}
    sizes = LANES[::2] if quick else LANES
    runs = [spawn(_lanes_rank, cores, (sizes, (8 << 20) if quick else (128 << 20)),
                  transport="shm")[0] for _ in range(1 if quick else 3)]
    # the median of three worlds; m copiers cannot run more than m times one's rate:
    # beyond that is timing noise
    return {m: min(float(cores), max(1.0, statistics.median(float(r[m]) for r in runs)))
            for m in sizes}


def _median_time(fn, reps: int) -> float:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure_gamma(*, quick: bool = False) -> dict[str, float]:
    """Return seconds per byte of ``SUM.apply`` for ``float32`` and ``float64``."""
    from pycomm.ops import SUM

    sizes = COMPUTE[:2] if quick else COMPUTE
    out = {}
    for dtype in (np.float32, np.float64):
        times = []
        for nbytes in sizes:
            a = np.ones(nbytes // np.dtype(dtype).itemsize, dtype=dtype)
            b = np.ones_like(a)
            times.append(_median_time(lambda a=a, b=b: SUM.apply(a, b), 3 if quick else 9))
        out[np.dtype(dtype).name] = max(fit_line(sizes, times)[1], 0.0)
    return out


def measure_sigma(*, quick: bool = False) -> float:
    """Return seconds per byte that a fresh scratch buffer costs over a reused one."""
    sizes = COMPUTE[:2] if quick else COMPUTE
    extra = []
    for nbytes in sizes:
        src = np.ones(nbytes, dtype=np.uint8)
        reused = np.empty_like(src)

        def fresh(src=src):
            np.empty_like(src)[:] = src

        def again(src=src, reused=reused):
            reused[:] = src

        reps = 3 if quick else 9
        extra.append(_median_time(fresh, reps) - _median_time(again, reps))
    return max(fit_line(sizes, extra)[1], 0.0)


def tune(transports: list[str], nprocs: int = 2, *, quick: bool = False,
         command: str = "python -m pycomm.tuning.tune") -> dict[str, Any]:
    """Measure every constant and return the JSON-ready table (see the module docstring)."""
    import pycomm
    from pycomm import config

    load = os.getloadavg()
    gammas = measure_gamma(quick=quick)
    gamma = max(gammas.values())
    sigma = measure_sigma(quick=quick)
    lanes = {str(m): v for m, v in measure_lanes(quick=quick).items()}
    table: dict[str, Any] = {}
    points = {}
    for transport in transports:
        fit, times = measure_pingpong(transport, nprocs, quick=quick)
        wake = measure_wake(transport, fit["alpha"], quick=quick)
        wake_x = measure_exchange_wake(transport, fit["alpha_x"], quick=quick)
        table[transport] = {**fit, "gamma": gamma, "sigma": sigma, "wake": wake,
                            "wake_x": {f"{o:g}": v for o, v in wake_x.items()},
                            "lanes": lanes}
        points[transport] = {str(m): t for m, t in times.items()}
    cores = os.cpu_count() or 1
    table["source"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "cpu_count": cores,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pycomm": pycomm.__version__,
        "command": command,
        "ranks": nprocs,
        "quick": quick,
        "loadavg": [round(x, 2) for x in load],
        "loaded": load[0] > 0.5 * cores,
        "eager_limit": config.get("PYCOMM_EAGER_LIMIT"),
        "gamma_per_dtype": gammas,
        "points": points,
    }
    return table


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m pycomm.tuning.tune",
        description="Measure the cost-model constants (alpha, beta, gamma, sigma) of this "
                    "machine and write them as a JSON table for PYCOMM_TUNE_FILE.")
    parser.add_argument("-n", "--nprocs", type=int, default=2, help="ranks to start (>= 2)")
    parser.add_argument("--transport", choices=["shm", "tcp", "rdma", "all"], default="all",
                        help="transport(s) to measure (default: all)")
    parser.add_argument("--out", default="-",
                        help="file to write (default: stdout); a table already there keeps "
                             "the transports not measured now")
    parser.add_argument("--quick", action="store_true", help="fewer iterations (rough)")
    args = parser.parse_args(argv)
    if args.nprocs < 2:
        parser.error(f"-n must be at least 2, got {args.nprocs}")
    transports = ["shm", "tcp", "rdma"] if args.transport == "all" else [args.transport]
    command = "python -m pycomm.tuning.tune " + " ".join(sys.argv[1:] if argv is None else argv)
    table = tune(transports, args.nprocs, quick=args.quick, command=command.strip())
    if args.out != "-" and os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as fh:
            old = json.load(fh)
        kept = {k: v for k, v in old.items() if k not in table and k != "source"}
        if kept:
            table["source"]["kept_from"] = {"transports": sorted(kept),
                                            "date": old.get("source", {}).get("date")}
            table = {**kept, **table}
    text = json.dumps(table, indent=1, sort_keys=True) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    for transport in transports:
        c = table[transport]
        print(f"{transport}: alpha {c['alpha'] * 1e6:.2f} us, "
              f"beta {1 / c['beta'] / 1e9:.2f} GB/s, rendezvous alpha {c['alpha_rndv'] * 1e6:.2f} us, "
              f"beta {1 / c['beta_rndv'] / 1e9:.2f} GB/s, "
              f"gamma {1 / c['gamma'] / 1e9 if c['gamma'] else float('inf'):.2f} GB/s, "
              f"sigma {c['sigma'] * 1e9:.3f} ns/B, wake {c['wake'] * 1e6:.1f} us, exchange wake "
              + ", ".join(f"{v * 1e6:.1f} us at {o}x" for o, v in c["wake_x"].items()),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
