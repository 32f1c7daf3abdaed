"""Measure the cost model's constants on this machine: ``python -m pycomm.tuning.tune``.

Usage::

    python -m pycomm.tuning.tune [-n 2] [--transport shm|tcp|rdma|all] [--out FILE] [--quick]
    python launch.py --nnodes 2 ... pycomm/tuning/tune_links.py --out FILE [--quick]

The first writes the table :mod:`pycomm.tuning.cost` reads (to stdout, or ``FILE``, keeping
the transports of a table already there): per transport ``alpha``, ``beta``,
``alpha_rndv``, ``beta_rndv``, ``alpha_x``, ``gamma``, ``wake``, ``wake_x`` ({ranks per core:
s}) and ``lanes`` ({bytes: copies}), and under ``source`` the run (date, host, cpu_count,
versions, command, loadavg, ranks, eager_limit, the measured points). The second, run on
every rank of a job spanning hosts (issue 16), adds the ``net`` entry that prices the steps
crossing hosts (:func:`links_entry`). What is measured (OSU's method: medians of timed
loops, each after a barrier):

* **alpha, beta, alpha_rndv, beta_rndv**: ranks 0 and 1 ping-pong ``Send``/``Recv``, one-way
  time = round trip / 2; ``alpha`` the intercept of the least-squares line over 8 B .. 4 KiB,
  ``beta`` its slope over 4 .. 64 KiB (eager), the rendezvous pair the line over the sizes
  past ``PYCOMM_EAGER_LIMIT`` up to 8 MiB, fitted on relative residuals (they span decades);
* **alpha_x**: an exchange step, both ranks ``Sendrecv`` at once, intercept over 8 B .. 4 KiB;
* **wake**: a one-way hop of a token ring on two ranks per core, less alpha; **wake_x**: a
  dissemination step at ``o`` = 2 and 4 ranks per core, ``(step - alpha_x) / o``;
* **gamma**: the slope of ``SUM.apply`` over 256 KiB .. 16 MiB (the larger of float32's and
  float64's); **lanes**: for buffers of 256 KiB .. 16 MiB, the best aggregate copy rate of 1
  .. cores ranks copying at once over one copy's. The CPU's figures (gamma, lanes, and in
  ``net`` the wake-ups) are the same in every entry.

A table is only as good as the machine was quiet: ``source.loadavg`` says how loaded.
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

__all__ = ["fit_line", "fit_link", "measure_pair", "measure_pingpong", "measure_wake",
           "measure_exchange_wake", "measure_gamma", "measure_lanes", "tune", "main",
           "links_entry", "links_main"]

SMALL = [8, 64, 512, 4096]                        # bytes: alpha and alpha_x fits
EAGER = [4096, 16384, 65536]                      # bytes: beta fit (eager protocol)
LARGE = [1 << 17, 1 << 18, 1 << 19, 1 << 20, 2 << 20, 4 << 20, 8 << 20]  # rendezvous fit
COMPUTE = [256 << 10, 1 << 20, 4 << 20, 16 << 20]  # bytes: gamma fit and lanes


def fit_line(xs: list[float], ys: list[float], *, relative: bool = False
             ) -> tuple[float, float]:
    """Least-squares ``(intercept, slope)`` through ``(xs, ys)``; ``relative``: weigh
    each point by ``1 / y`` (for sizes spanning decades).

    Raises:
        ValueError: fewer than two distinct ``xs``.
    """
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("a line needs at least two distinct sizes")
    w = 1.0 / np.abs(y) if relative and np.all(y != 0) else np.ones_like(y)
    (intercept, slope), *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x], axis=1) * w[:, None],
                                             y * w, rcond=None)
    return float(intercept), float(slope)


def _iterations(nbytes: int, quick: bool) -> int:
    budget = 2e6 if quick else 5e7  # bytes moved per timed loop: long enough to time
    return int(min(200 if quick else 1000, max(3, budget // max(nbytes, 1))))


def _per_unit(comm, run, reps: int) -> float:
    """Median seconds per unit of ``run()`` (which returns its units) over ``reps`` timed
    calls, each after a barrier, after one warm-up call."""
    samples = []
    for rep in range(reps + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        units = run()
        if rep:
            samples.append((time.perf_counter() - t0) / units)
    return statistics.median(samples)


def measure_pair(comm, a: int, b: int, sizes: list[int], *, quick: bool = False,
                 reps: int = 3) -> tuple[dict[int, float], dict[int, float]]:
    """One-way seconds per size between ranks ``a`` and ``b`` of ``comm`` (ping-pong), and
    seconds per exchange step (``Sendrecv`` both ways) per :data:`SMALL` size.

    Collective over ``comm`` (the other ranks wait at the barriers); every rank gets
    ``a``'s timings.
    """
    me = comm.rank
    active, peer = me in (a, b), (b if me == a else a)
    oneway, exchange = {}, {}
    for nbytes in sizes:
        buf, iters = np.zeros(nbytes, dtype=np.uint8), _iterations(nbytes, quick)

        def pingpong(buf=buf, iters=iters) -> int:
            for _ in range(iters if active else 0):
                if me == a:
                    comm.Send(buf, b)
                    comm.Recv(buf, b)
                else:
                    comm.Recv(buf, a)
                    comm.Send(buf, a)
            return 2 * iters
        oneway[nbytes] = _per_unit(comm, pingpong, reps)
    for nbytes in SMALL:
        out, into = np.zeros(nbytes, dtype=np.uint8), np.zeros(nbytes, dtype=np.uint8)
        iters = _iterations(nbytes, quick)

        def swap(out=out, into=into, iters=iters) -> int:
            for _ in range(iters if active else 0):
                comm.Sendrecv(out, peer, recvbuf=into, source=peer)
            return iters
        exchange[nbytes] = _per_unit(comm, swap, reps)
    return comm.bcast((oneway, exchange), root=a)


def fit_link(oneway: dict[int, float], exchange: dict[int, float], eager_limit: int
             ) -> dict[str, float]:
    """``alpha``, ``beta``, ``alpha_rndv``, ``beta_rndv`` and ``alpha_x`` from one pair's
    timings (module docstring); where a noisy fit is not positive, the measured time
    (per byte) of the nearest size instead."""
    eager = [m for m in EAGER if m <= eager_limit and m in oneway]
    rndv = [m for m in sorted(oneway) if m > eager_limit]
    alpha, _ = fit_line(SMALL, [oneway[m] for m in SMALL])
    _, beta = fit_line(eager, [oneway[m] for m in eager])
    alpha_rndv, beta_rndv = fit_line(rndv, [oneway[m] for m in rndv], relative=True)
    alpha_x, _ = fit_line(SMALL, [exchange[m] for m in SMALL])
    alpha = alpha if alpha > 0 else min(oneway[m] for m in SMALL)
    return {"alpha": alpha, "beta": beta if beta > 0 else oneway[eager[-1]] / eager[-1],
            "alpha_rndv": alpha_rndv if alpha_rndv > 0 else oneway[rndv[0]],
            "beta_rndv": beta_rndv if beta_rndv > 0 else oneway[rndv[-1]] / rndv[-1],
            "alpha_x": max(alpha_x, alpha)}   # an exchange costs at least a message


def _pingpong_rank(sizes: list[int], reps: int, quick: bool):
    import pycomm
    return measure_pair(pycomm.COMM_WORLD, 0, 1, sizes, quick=quick, reps=reps)


def measure_pingpong(transport: str, nprocs: int = 2, *, quick: bool = False
                     ) -> tuple[dict[str, float], dict[int, float]]:
    """:func:`fit_link` of ranks 0 and 1 of ``nprocs`` started over ``transport``, and
    the one-way seconds per size.

    Raises:
        ValueError: ``nprocs < 2``, or an eager limit leaving fewer than two sizes on a side.
        CommError: the ranks could not be started or failed.
    """
    from pycomm import config
    from pycomm.launch.spawning import spawn

    if nprocs < 2:
        raise ValueError(f"pycomm.tuning.tune needs at least 2 ranks, got -n {nprocs}")
    limit = config.get("PYCOMM_EAGER_LIMIT")
    eager, rndv = [m for m in EAGER if m <= limit], [m for m in LARGE if m > limit]
    if len(eager) < 2 or len(rndv) < 2:
        raise ValueError(f"PYCOMM_EAGER_LIMIT={limit} leaves too few sizes to fit: eager "
                         f"{eager}, rendezvous {rndv} (needs 16 KiB .. 2 MiB)")
    times, exchange = spawn(_pingpong_rank, nprocs, (sorted(set(SMALL + eager + rndv)),
                                                     2 if quick else 5, quick),
                            transport=transport)[0]
    return fit_link(times, exchange, limit), times


def _steps_rank(rounds: int, exchange: bool) -> float:
    """Seconds per step of 8-byte messages among all ranks: one-way hops of a token ring,
    or (``exchange``) dissemination rounds, whose step ``k`` sends to ``rank + 2^k`` and
    receives from ``rank - 2^k`` at once."""
    import pycomm
    comm = pycomm.COMM_WORLD
    p, r, out, into = comm.size, comm.rank, np.zeros(1), np.zeros(1)

    def token_ring() -> int:
        for _ in range(rounds):
            if r == 0:
                comm.Send(out, 1 % p)
                comm.Recv(out, p - 1)
            else:
                comm.Recv(out, r - 1)
                comm.Send(out, (r + 1) % p)
        return rounds * p

    def disseminate() -> int:
        steps = 0
        for _ in range(rounds):
            d = 1
            while d < p:
                comm.Sendrecv(out, (r + d) % p, recvbuf=into, source=(r - d) % p)
                d, steps = 2 * d, steps + 1
        return steps
    return _per_unit(comm, disseminate if exchange else token_ring, 3)


def _step_of_worlds(nprocs: int, rounds: int, exchange: bool, transport: str,
                    quick: bool) -> float:
    """:func:`_steps_rank` on ``nprocs`` ranks, the median of three worlds started afresh
    (one when ``quick``): where the scheduler places the ranks is fixed for a world's life
    and moves the figure."""
    from pycomm.launch.spawning import spawn
    return statistics.median(spawn(_steps_rank, nprocs, (rounds, exchange),
                                   transport=transport)[0] for _ in range(1 if quick else 3))


def measure_wake(transport: str, alpha: float, *, quick: bool = False) -> float:
    """Seconds a one-way step pays per turn of the cores when ranks outnumber them: a
    token ring's hop on two ranks per core, less ``alpha``."""
    hop = _step_of_worlds(2 * available_cores(), 50 if quick else 300, False, transport, quick)
    return max(0.0, hop - alpha)


def measure_exchange_wake(transport: str, alpha_x: float, *,
                          quick: bool = False) -> dict[float, float]:
    """``{o: seconds}`` an exchange step pays per turn of the cores at ``o`` ranks per
    core: ``(step - alpha_x) / o``, a dissemination step at ``o`` = 2 and (not ``quick``,
    up to 64 ranks) 4."""
    cores = available_cores()
    return {float(o): max(0.0, _step_of_worlds(o * cores, 30 if quick else 150, True,
                                               transport, quick) - alpha_x) / o
            for o in ((2,) if quick or 4 * cores > 64 else (2, 4))}


def _lanes_rank(sizes: list[int], volume: int) -> dict[int, float]:
    """For ``m = 1 .. size`` ranks copying ``volume`` bytes at once in buffers of each
    size: ``{bytes: the best aggregate rate / one copy's}``."""
    import pycomm
    comm, out = pycomm.COMM_WORLD, {}
    for nbytes in sizes:
        src = np.ones(nbytes, dtype=np.uint8)
        dst = src.copy()                           # pages faulted in
        reps, rates = max(2, volume // nbytes), []
        for m in range(1, comm.size + 1):
            samples = []
            for _ in range(5):
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(reps if comm.rank < m else 0):
                    np.copyto(dst, src)
                took = time.perf_counter() - t0 if comm.rank < m else 0.0
                samples.append(max(comm.allgather(took)))   # the slowest copier
            rates.append(m * reps * nbytes / statistics.median(samples))
        out[nbytes] = max(rates) / rates[0]
    return out


def measure_lanes(*, quick: bool = False) -> dict[int, float]:
    """``{bytes: lanes}``: how many copies of that size the memory runs at full speed at
    once (one rank per core, at most 16; the median of three worlds, at most the cores)."""
    from pycomm.launch.spawning import spawn
    cores = max(1, min(available_cores(), 16))
    sizes = COMPUTE[::2] if quick else COMPUTE
    if cores == 1:
        return {m: 1.0 for m in sizes}
    runs = [spawn(_lanes_rank, cores, (sizes, (8 << 20) if quick else (128 << 20)),
                  transport="shm")[0] for _ in range(1 if quick else 3)]
    return {m: min(float(cores), max(1.0, statistics.median(float(r[m]) for r in runs)))
            for m in sizes}


def measure_gamma(*, quick: bool = False) -> dict[str, float]:
    """Seconds per byte of ``SUM.apply`` (in-place ``np.add``) per dtype (float32, float64)."""
    from pycomm.ops import SUM
    sizes, out = (COMPUTE[:2] if quick else COMPUTE), {}
    for dtype in (np.float32, np.float64):
        times = []
        for nbytes in sizes:
            a = np.ones(nbytes // np.dtype(dtype).itemsize, dtype=dtype)
            b, samples = np.ones_like(a), []
            for _ in range(3 if quick else 9):
                t0 = time.perf_counter()
                SUM.apply(a, b)
                samples.append(time.perf_counter() - t0)
            times.append(statistics.median(samples))
        out[np.dtype(dtype).name] = max(fit_line(sizes, times)[1], 0.0)
    return out


def tune(transports: list[str], nprocs: int = 2, *, quick: bool = False,
         command: str = "python -m pycomm.tuning.tune") -> dict[str, Any]:
    """Measure every constant; return the JSON-ready table (module docstring)."""
    import pycomm
    from pycomm import config

    load = os.getloadavg()
    gammas = measure_gamma(quick=quick)
    lanes = {str(m): v for m, v in measure_lanes(quick=quick).items()}
    table: dict[str, Any] = {}
    points = {}
    for transport in transports:
        fit, times = measure_pingpong(transport, nprocs, quick=quick)
        wake_x = measure_exchange_wake(transport, fit["alpha_x"], quick=quick)
        table[transport] = {**fit, "gamma": max(gammas.values()), "lanes": lanes,
                            "wake": measure_wake(transport, fit["alpha"], quick=quick),
                            "wake_x": {f"{o:g}": v for o, v in wake_x.items()}}
        points[transport] = {str(m): t for m, t in times.items()}
    table["source"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(), "cpu_count": os.cpu_count() or 1,
        "python": platform.python_version(), "numpy": np.__version__,
        "pycomm": pycomm.__version__, "command": command, "ranks": nprocs, "quick": quick,
        "loadavg": [round(x, 2) for x in load], "loaded": load[0] > 0.5 * (os.cpu_count() or 1),
        "eager_limit": config.get("PYCOMM_EAGER_LIMIT"), "gamma_per_dtype": gammas,
        "points": points}
    return table


def main(argv: list[str] | None = None) -> int:
    """``python -m pycomm.tuning.tune``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m pycomm.tuning.tune",
        description="Measure the cost-model constants of this machine and write them as a "
                    "JSON table for PYCOMM_TUNE_FILE.")
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
    _write(table, args.out)
    for transport in transports:
        print(f"{transport}: " + ", ".join(f"{k} {table[transport][k]:.3g}" for k in
                                           ("alpha", "beta", "alpha_x", "wake")), file=sys.stderr)
    return 0


def _write(table: dict, path: str) -> None:
    text = json.dumps(table, indent=1, sort_keys=True) + "\n"
    if path == "-":
        sys.stdout.write(text)
    else:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)


def links_entry(comm, *, quick: bool = False) -> dict:
    """Measure the ``net`` entry on ``comm``, which spans hosts (collective): the
    :func:`fit_link` of the lowest ranks of hosts 0 and 1, the CPU's figures (gamma, wake,
    wake_x, lanes) of the ``shm`` entry in force, and under ``measured`` the pair, the
    hosts and, when host 0 has two ranks, the fit of its two lowest (``local``).

    Raises:
        ArgumentError: ``comm`` has no ``host_layout`` or lies on one host.
    """
    from pycomm import config
    from pycomm.errors import ArgumentError
    from pycomm.tuning.cost import DEFAULT_TRANSPORT, load_table

    layout = getattr(comm, "host_layout", None)
    if layout is None or layout.nhosts < 2:
        raise ArgumentError(f"rank {comm.rank}: tune_links needs a job spanning hosts "
                            f"(this one has {0 if layout is None else layout.nhosts})")
    eager = int(config.get("PYCOMM_EAGER_LIMIT"))
    sizes, reps = SMALL + EAGER[1:] + (LARGE[:3] if quick else LARGE), 1 if quick else 3

    def fit(a: int, b: int) -> dict:
        return fit_link(*measure_pair(comm, a, b, sizes, quick=quick, reps=reps), eager)
    a, b = layout.hosts[0][0], layout.hosts[1][0]
    shm = load_table()[DEFAULT_TRANSPORT]
    entry = {**fit(a, b), "gamma": shm.gamma, "wake": shm.wake,
             "wake_x": {f"{o:g}": v for o, v in shm.wake_x},
             "lanes": {str(int(m)): v for m, v in shm.lanes},
             "measured": {"pair": [a, b], "hosts": [list(g) for g in layout.hosts],
                          "names": list(layout.names)}}
    if len(layout.hosts[0]) > 1:
        entry["measured"]["local"] = fit(*layout.hosts[0][:2])
    return entry


def links_main(argv: list[str] | None = None) -> int:
    """``pycomm/tuning/tune_links.py --out FILE [--quick]`` on every rank of a job spanning
    hosts: rank 0 writes (or updates) ``FILE``'s ``net`` entry."""
    import pycomm

    parser = argparse.ArgumentParser(
        prog="pycomm/tuning/tune_links.py",
        description="Measure the link between hosts (the cost model's net entry).")
    parser.add_argument("--out", required=True, help="table to write or update (rank 0)")
    parser.add_argument("--quick", action="store_true", help="fewer, smaller sizes")
    args = parser.parse_args(argv)
    comm, t0 = pycomm.COMM_WORLD, time.time()
    entry = links_entry(comm, quick=args.quick)
    if comm.rank == 0:
        entry["measured"].update({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "seconds": round(time.time() - t0, 1), "loadavg": list(os.getloadavg()),
            "command": "pycomm/tuning/tune_links.py " + " ".join(argv or sys.argv[1:])})
        table = {}
        if os.path.exists(args.out):
            with open(args.out, encoding="utf-8") as fh:
                table = json.load(fh)
        _write({**table, "net": entry}, args.out)
        print(f"tune_links: net alpha {entry['alpha'] * 1e6:.1f} us, beta_rndv "
              f"{1e-6 / entry['beta_rndv']:.0f} MB/s -> {args.out}", flush=True)
    comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
