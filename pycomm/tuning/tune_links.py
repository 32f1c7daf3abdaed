"""Measure the cost model's link classes on a multi-host job: inside a host and between hosts.

Run on every rank of a job that spans hosts (issue 16), e.g.::

    python launch.py --nnodes 2 --node-rank K --master-addr HOST --nproc-per-node 2 \\
        pycomm/tuning/tune_links.py --out links.json

Rank 0 writes (or updates) ``links.json``, a table for ``PYCOMM_TUNE_FILE`` whose ``net``
entry prices every step that crosses hosts (:func:`pycomm.tuning.cost.model_transport`):
a communicator spanning hosts is then priced with it rather than with the loopback-TCP
row that ``python -m pycomm.tuning.tune`` measures on one machine, and the automatic choice
weighs the hierarchical algorithms (local steps at ``shm``'s constants, cross-host steps at
``net``'s) against the flat ones (every step at ``net``'s).

What is measured, with :mod:`pycomm.tuning.tune`'s method (ping-pong ``Send``/``Recv``, one-way
time = round trip / 2, median of timed loops; lines fitted with :func:`pycomm.tuning.tune.fit_line`):
between the lowest ranks of hosts 0 and 1 (**net**) and between the two lowest ranks of
host 0 (**local**, when it has two): ``alpha`` (8 B .. 4 KiB), ``beta`` (4 .. 64 KiB),
``alpha_rndv``/``beta_rndv`` (past the eager limit, 128 KiB .. 8 MiB, relative fit) and
``alpha_x`` (an exchange step, ``Sendrecv`` both ways at once). The ``net`` entry takes γ, σ,
wake and lanes from the ``shm`` entry in force (they are the CPU's); the local pair's
figures are kept under ``net.measured.local`` for comparison with the ``shm`` entry. The
other ranks wait at barriers while a pair is timed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

import pycomm
from pycomm.tuning.cost import DEFAULT_TRANSPORT, NET, load_table
from pycomm.errors import ArgumentError
from pycomm.tuning.tune import EAGER, LARGE, SMALL, _iterations, _per_unit, fit_line

__all__ = ["measure_pair", "links_entry", "main"]


def measure_pair(comm, a: int, b: int, sizes: list[int], *, quick: bool = False,
                 reps: int = 3) -> tuple[dict[int, float], dict[int, float]]:
    """One-way seconds per size between ranks ``a`` and ``b`` of ``comm`` (ping-pong), and
    seconds per exchange step (``Sendrecv`` both ways) for :data:`pycomm.tuning.tune.SMALL` sizes.

    Collective over ``comm``: every rank calls it (the others wait at the barriers).
    Returns the dicts on every rank (only ``a``'s timings are meaningful elsewhere: they
    are broadcast from ``a``).
    """
    me = comm.rank
    peer = b if me == a else a
    active = me in (a, b)
    oneway, exchange = {}, {}
    for nbytes in sizes:
        buf = np.zeros(nbytes, dtype=np.uint8)
        iters = _iterations(nbytes, quick)

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


def _fit(oneway: dict[int, float], exchange: dict[int, float], eager: int) -> dict:
    """The α/β entry fields from one pair's timings (as :mod:`pycomm.tuning.tune` fits them)."""
    alpha, _ = fit_line(SMALL, [oneway[s] for s in SMALL])
    _, beta = fit_line(EAGER, [oneway[s] for s in EAGER])
    large = [s for s in oneway if s > eager] or [s for s in LARGE if s in oneway]
    arndv, brndv = fit_line(large, [oneway[s] for s in large], relative=True)
    ax, _ = fit_line(SMALL, [exchange[s] for s in SMALL])
    return {"alpha": max(alpha, 1e-7), "beta": max(beta, 1e-13),
            "alpha_rndv": max(arndv, alpha, 1e-7), "beta_rndv": max(brndv, 1e-13),
            "alpha_x": max(ax, alpha, 1e-7)}


def links_entry(comm, *, quick: bool = False) -> dict:
    """Measure the ``net`` table entry on ``comm`` (collective; ``comm`` spans hosts).

    Raises:
        ArgumentError: ``comm`` has no ``host_layout`` or lies on one host.
    """
    lay = getattr(comm, "host_layout", None)
    if lay is None or lay.nhosts < 2:
        raise ArgumentError(f"rank {comm.rank}: tune_links needs a job spanning hosts "
                            f"(this one has {0 if lay is None else lay.nhosts})")
    eager = int(pycomm.config.get("PYCOMM_EAGER_LIMIT"))
    sizes = SMALL + EAGER[1:] + (LARGE[:3] if quick else LARGE)
    a, b = lay.hosts[0][0], lay.hosts[1][0]
    reps = 1 if quick else 3
    entry = _fit(*measure_pair(comm, a, b, sizes, quick=quick, reps=reps), eager)
    shm = load_table()[DEFAULT_TRANSPORT]
    entry.update({"gamma": shm.gamma, "sigma": shm.sigma, "wake": shm.wake,
                  "wake_x": {str(k): v for k, v in shm.wake_x},
                  "lanes": {str(k): v for k, v in shm.lanes}})
    measured = {"pair": [a, b], "hosts": [list(g) for g in lay.hosts],
                "names": list(lay.names)}
    if len(lay.hosts[0]) > 1:
        la, lb = lay.hosts[0][0], lay.hosts[0][1]
        measured["local"] = _fit(*measure_pair(comm, la, lb, sizes, quick=quick, reps=reps),
                                 eager)
    entry["measured"] = measured
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="table to write or update (rank 0)")
    ap.add_argument("--quick", action="store_true", help="fewer, smaller sizes")
    args = ap.parse_args(argv)
    comm = pycomm.COMM_WORLD
    t0 = time.time()
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
        table[NET] = entry
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(table, fh, indent=1, sort_keys=True)
            fh.write("\n")
        print(f"tune_links: net alpha {entry['alpha'] * 1e6:.1f} us, beta_rndv "
              f"{1 / entry['beta_rndv'] / 1e6:.0f} MB/s -> {args.out}", flush=True)
    comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
