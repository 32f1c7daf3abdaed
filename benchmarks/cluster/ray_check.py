"""A Ray driver that checks pycomm.ray across the nodes of a Ray cluster.

``python -m benchmarks.cluster.ray_check ADDRESS MODE... [--size N]`` joins the Ray
cluster at ADDRESS (``ray.init(address=...)``) and, for each MODE in turn, makes a pycomm
world of N actors (default 4) and prints ``MODE <mode>``, then what it found:

* ``run``: :func:`pycomm.ray.run` with ``num_cpus=1`` per actor (Ray places them; on
  nodes of ``N/2`` CPUs, half on each) runs benchmarks/cluster/check_app.py's checks
  (Allreduce, Bcast, Allgather against numpy; every rank's host; the transports; the
  world's host layout and local ranks).
* ``declared``: the driver starts N actors itself, rank r on the emulated host named by
  the custom resource ``host<1 + r % 2>`` (cyclic: ranks 0, 2 on host1 and 1, 3 on
  host2), declares them a group with :func:`pycomm.ray.create_collective_group`; each
  actor joins with :func:`pycomm.ray.get_group_handle`, runs the same checks, and leaves.
* ``raise`` / ``die``: :func:`pycomm.ray.run` where the last rank, after an Allreduce,
  raises (``raise``) or its process exits at once (``die``, ``os._exit``) while the
  others wait for it in a Barrier.

For ``run`` and ``declared``: ``PLACED rank R host H node NODE`` (where Ray put its
actor) for every rank, then every rank's check_app line (``OK ...`` or ``BAD ...``). For
``raise`` and ``die``: ``FAILED <error type> rank <R> after <seconds> s: <message>`` (the
error pycomm.ray.run raised, and the rank it names) or ``NOT FAILED``. After each mode,
``LEFT ...`` if a pycomm directory actor is still alive; ``DONE`` at the end.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import numpy as np
import ray

import pycomm
import pycomm.ray as pray
from benchmarks.cluster.check_app import check
from pycomm.errors import PeerError, RemoteError

MODES = ("run", "declared", "raise", "die")


def _checked(comm) -> dict:
    rc, line = check(comm)
    return {"rank": comm.rank, "rc": rc, "line": line, "host": socket.gethostname(),
            "node": ray.get_runtime_context().get_node_id()}


def _fails(comm, how: str) -> int:
    x = np.ones(8)
    comm.Allreduce(pycomm.IN_PLACE, x)
    if comm.rank == comm.size - 1:
        if how == "die":
            os._exit(3)
        raise RuntimeError(f"rank {comm.rank} fails on purpose on {socket.gethostname()}")
    comm.Barrier()
    return comm.rank


@ray.remote(num_cpus=0)
class Member:
    """A user's actor: joins the group the driver declared, checks, leaves."""

    def ready(self) -> bool:
        return True

    def check(self, group: str) -> dict:
        try:
            return _checked(pray.get_group_handle(group, timeout=60))
        finally:
            pray.destroy_collective_group(group)


def _declared(n: int) -> list[dict]:
    actors = [Member.options(resources={f"host{1 + r % 2}": 1}).remote() for r in range(n)]
    try:
        ray.get([a.ready.remote() for a in actors], timeout=60)
        pray.create_collective_group(actors, n, group_name="hosts", timeout=60)
        return ray.get([a.check.remote("hosts") for a in actors], timeout=120)
    finally:
        pray.destroy_collective_group("hosts")
        for a in actors:
            ray.kill(a, no_restart=True)


def _mode(mode: str, n: int) -> int:
    print(f"MODE {mode}", flush=True)
    if mode in ("raise", "die"):
        t0 = time.monotonic()
        try:
            pray.run(_fails, n, mode, num_cpus=1, timeout=60, error_grace=15)
        except (RemoteError, PeerError) as exc:
            who = exc.rank if isinstance(exc, RemoteError) else exc.peer
            first = str(exc).splitlines()[0] if str(exc) else ""
            print(f"FAILED {type(exc).__name__} rank {who} after "
                  f"{time.monotonic() - t0:.1f} s: {first}", flush=True)
            rc = 0
        else:
            print("NOT FAILED", flush=True)
            rc = 1
    else:
        out = pray.run(_checked, n, num_cpus=1, timeout=60) if mode == "run" else \
            _declared(n)
        for r, o in enumerate(out):
            print(f"PLACED rank {r} host {o['host']} node {o['node']}", flush=True)
        for o in out:
            print(o["line"], flush=True)
        rc = max(o["rc"] for o in out)
    left = [a for a in ray.util.list_named_actors() if a.startswith("pycomm:")]
    if left:
        print(f"LEFT pycomm directories {left}", flush=True)
        rc = 1
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("address", help="the Ray cluster's GCS address (host:port)")
    ap.add_argument("modes", nargs="+", choices=MODES)
    ap.add_argument("--size", type=int, default=4, help="actors per world (default 4)")
    args = ap.parse_args(argv)
    ray.init(address=args.address, log_to_driver=False, configure_logging=False)
    try:
        rc = max(_mode(mode, args.size) for mode in args.modes)
        print("DONE", flush=True)
        return rc
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
