"""A rank's check of the hierarchical collectives (issue 16) against numpy.

Run as a program (one process per rank, e.g. by ``launch.py --nnodes``) it checks
COMM_WORLD and sub-communicators built from it, and prints one line
``HIER OK rank R/S checks N shapes A;B;...`` (each shape: ranks per host of a checked
communicator, with ``c`` for a communicator whose hosts are interleaved), or exits 1 with
the first mismatch. :func:`check_all` is also run by the single-host tests on a world whose
``host_layout`` they fake.

Communicators checked: the world; the world re-ordered to the other placement (a block
world becomes cyclic and a cyclic one block: ``Split`` with keys); the world less its last
rank (uneven hosts when the world's were even); the first two ranks of the first two hosts
as a 2 x 2 communicator, block and cyclic. On each: Allreduce (SUM of float64 with
integer values, so every order of operands gives exact results; MAX of int32), Reduce and
Bcast from every root, Allgather, Barrier, with ``algorithm="hierarchical"`` and with the
automatic choice, for counts 0, 1, 7 and 40000 (the last above the eager limit), and an
Iallreduce. The automatic choice on a communicator that spans hosts must be
``hierarchical`` at 16 MiB (and for Barrier), and a flat latency-optimal algorithm for an
8 B Allreduce (one step over the link beats three levels there; benchmarks/README.md,
issue 16). Each sub-communicator's ``host_layout`` is
checked against the hostnames its ranks report.
"""

from __future__ import annotations

import socket
import sys

import numpy as np

import pycomm

COUNTS = (0, 1, 7, 40000)
AUTO_COLLECTIVES = {"allreduce": 1 << 24, "bcast": 1 << 24, "reduce": 1 << 24,
                    "allgather": 1 << 24, "barrier": 0}


class CheckFailed(AssertionError):
    """A hierarchical collective gave a wrong result or a wrong layout."""


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)


def shape(comm) -> str:
    """``"2x2"``, ``"3+2"`` or ``"2x2c"``: ranks per host, ``c`` when hosts interleave."""
    lay = comm.host_layout
    sizes = [len(g) for g in lay.hosts]
    text = f"{len(sizes)}x{sizes[0]}" if len(set(sizes)) == 1 else "+".join(map(str, sizes))
    flat = [r for g in lay.hosts for r in g]
    return text + ("" if flat == sorted(flat) else "c")


def check_layout(comm, host_of) -> None:
    """``comm.host_layout`` groups its ranks as ``host_of(rank)`` (a host key) does."""
    keys = comm.allgather(host_of(comm))
    groups: dict = {}
    for r, k in enumerate(keys):
        groups.setdefault(k, []).append(r)
    want = tuple(tuple(g) for g in sorted(groups.values(), key=lambda g: g[0]))
    lay = comm.host_layout
    _expect(lay.hosts == want, f"rank {comm.rank}: {comm.name} layout {lay.hosts}, want {want}")
    _expect(lay.hosts[lay.host][lay.local_rank] == comm.rank,
            f"rank {comm.rank}: {comm.name} host {lay.host} local {lay.local_rank} is wrong")


def check_collectives(comm) -> int:
    """Every hierarchical collective on ``comm`` against numpy; returns the checks made."""
    rank, size, n = comm.rank, comm.size, 0
    spans = comm.host_layout.nhosts > 1
    for coll, nbytes in AUTO_COLLECTIVES.items():
        got = comm.chosen_algorithm(coll, nbytes, algorithm="auto")
        _expect(got == "hierarchical" or not spans,
                f"rank {rank}: auto {coll} of {nbytes} B on {shape(comm)} chose {got}")
    got = comm.chosen_algorithm("allreduce", 8, algorithm="auto")
    _expect(got != "hierarchical" or not spans,
            f"rank {rank}: auto allreduce of 8 B on {shape(comm)} chose {got}")
    for alg in ("hierarchical", None):
        for count in COUNTS:
            base = np.arange(count, dtype=np.float64)
            out = np.full(count, -1.0)
            comm.Allreduce(base * (rank + 1), out, op=pycomm.SUM, algorithm=alg)
            _expect(np.array_equal(out, base * (size * (size + 1) // 2)),
                    f"rank {rank}: Allreduce SUM {count} on {shape(comm)}")
            ints = (np.arange(count, dtype=np.int32) * 7 + rank * 13) % 101
            mx = np.empty_like(ints)
            comm.Allreduce(ints, mx, op=pycomm.MAX, algorithm=alg)
            want = np.max([(np.arange(count, dtype=np.int32) * 7 + r * 13) % 101
                           for r in range(size)], axis=0) if count else ints
            _expect(np.array_equal(mx, want), f"rank {rank}: Allreduce MAX {count}")
            for root in range(size):
                red = np.full(count, -1.0) if rank == root else None
                comm.Reduce(base + rank, red, op=pycomm.SUM, root=root, algorithm=alg)
                if rank == root:
                    _expect(np.array_equal(red, base * size + size * (size - 1) // 2),
                            f"rank {rank}: Reduce root {root} count {count}")
                buf = base + 100 * root if rank == root else np.zeros(count)
                comm.Bcast(buf, root=root, algorithm=alg)
                _expect(np.array_equal(buf, base + 100 * root),
                        f"rank {rank}: Bcast root {root} count {count} on {shape(comm)}")
            ag = np.full(size * count, -1, dtype=np.int64)
            comm.Allgather(np.arange(count, dtype=np.int64) + 1000 * rank, ag, algorithm=alg)
            want_ag = np.concatenate([np.arange(count, dtype=np.int64) + 1000 * r
                                      for r in range(size)])
            _expect(np.array_equal(ag, want_ag),
                    f"rank {rank}: Allgather {count} on {shape(comm)}: {ag[:20]}")
            comm.Barrier(algorithm=alg)
            n += 5 + 2 * size
    out = np.empty(1000)
    req = comm.Iallreduce(np.ones(1000), out, algorithm="hierarchical")
    req.Wait()
    _expect(np.all(out == size), f"rank {rank}: Iallreduce on {shape(comm)}")
    return n + 1


def _sub_communicators(world):
    """The world and the sub-communicators described in the module docstring."""
    lay = world.host_layout
    rank, hosts = world.rank, lay.nhosts
    width = max(len(g) for g in lay.hosts)
    flat = [r for g in lay.hosts for r in g]
    block = flat == sorted(flat)
    subs = [world]
    # the same ranks with the other placement: interleaved hosts if the world's are in
    # blocks, blocks if they interleave
    subs.append(world.Split(0, key=(lay.local_rank * hosts + lay.host) if block
                            else (lay.host * width + lay.local_rank)))
    subs.append(world.Split(0 if rank < world.size - 1 else pycomm.UNDEFINED, key=rank))
    if hosts >= 2 and min(len(g) for g in lay.hosts[:2]) >= 2:
        color = 0 if lay.host < 2 and lay.local_rank < 2 else pycomm.UNDEFINED
        subs.append(world.Split(color, key=lay.host * 2 + lay.local_rank))    # 2 x 2 block
        subs.append(world.Split(color, key=lay.local_rank * 2 + lay.host))    # cyclic
    return [c for c in subs if c != pycomm.COMM_NULL]


def check_all(world, host_of=lambda c: socket.gethostname()) -> tuple[int, list[str]]:
    """Check ``world`` and its sub-communicators; returns (checks, shapes checked).

    Args:
        world: a communicator with a ``host_layout``.
        host_of: ``host_of(comm)`` names this process's host (default its hostname; the
            single-host tests pass the host of their faked layout).

    Raises:
        CheckFailed: the first wrong result or layout.
    """
    checks, shapes = 0, []
    for comm in _sub_communicators(world):
        check_layout(comm, host_of)
        checks += check_collectives(comm) + 1
        shapes.append(shape(comm))
        if comm is not world:
            comm.Free()
    return checks, shapes


def main() -> int:
    comm = pycomm.COMM_WORLD
    try:
        checks, shapes = check_all(comm)
    except CheckFailed as exc:
        print(f"HIER BAD {exc}", flush=True)
        return 1
    print(f"HIER OK rank {comm.rank}/{comm.size} checks {checks} shapes {';'.join(shapes)}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
