"""Differential fuzzing of pycomm's collectives and point-to-point calls (2026-11-26).

A *case* is a seed. Every rank of a world runs :func:`fuzz_task` with the same seed: a
program random generator, seeded by the case alone, draws the same sequence of steps on
every rank (collective, communicator, dtype, op, count, root, algorithm, IN_PLACE, buffer
offsets, blocking or not); each rank's input of a step comes from a generator seeded by
(seed, step, world rank, part), so every rank rebuilds every other rank's input and computes
the numpy reference of its own result. A rank returns, per step, an outcome record; the
driver (:func:`check_case`) then also compares the ranks' records with each other: the
same error on every rank or none, and bit-identical all-reduce results on every rank of a
communicator.

Exactness: integer, bool, copy and gather results must be equal. Floating-point inputs
come in two modes: "exact" (small multiples of 1/8, or powers of two for PROD: every sum
and product of up to 9 of them is representable, so any order of evaluation gives the
same bits, and the result must equal the reference exactly) and "random" (uniform; a sum
of n terms evaluated in any order is within (n-1)·eps·Σ|x_i| of the exact sum (each of
the n-1 additions rounds by at most eps/2 of a partial sum bounded by Σ|x_i|; the
tolerance takes n·eps·Σ|x_i|, eps of the dtype), a product of n factors within about
2n·eps relative).

Run a campaign: ``python tests/fuzzgen.py --minutes 30`` (one world at a time, at most
8 ranks). ``python tests/fuzzgen.py --replay SIZE TRANSPORT SEED [--steps N]`` reruns
one case and prints its failures. Failures are appended to ``--log`` as JSON lines.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
import time
import traceback

import numpy as np

import pycomm

KIB = 1024
EAGER = 64 * KIB
# element counts around the protocol thresholds: shm slots 64 KiB/rank, eager 64 KiB,
# direct reads 16 KiB-256 KiB, and a few MiB
BYTE_MARKS = (16 * KIB, 64 * KIB, 128 * KIB, 256 * KIB, 1024 * KIB)
SMALL_COUNTS = (0, 1, 2, 3, 5, 7, 8, 13, 64, 100, 255, 1000, 1001)
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
FLOAT_DTYPES = ("float16", "float32", "float64")
CPLX_DTYPES = ("complex64", "complex128")
ALL_DTYPES = INT_DTYPES + FLOAT_DTYPES + CPLX_DTYPES + ("bool",)
PAIR_VALUES = ("float64", "float32", "int64", "int32", "int16")
AFFINE = np.dtype([("a", "<i8"), ("b", "<i8")])
OPS_BY_KIND = {
    "b": ("LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR"),
    "i": ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR",
          "USER_SUM"),
    "u": ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR",
          "USER_SUM"),
    "f": ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR"),
    "c": ("SUM", "PROD"),
}
UFUNCS = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum,
          "LAND": np.logical_and, "LOR": np.logical_or, "LXOR": np.logical_xor,
          "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor,
          "USER_SUM": np.add}
REDUCING = ("allreduce", "reduce", "reduce_scatter_block", "reduce_scatter", "scan",
            "exscan")
COPYING = ("bcast", "allgather", "gather", "scatter", "alltoall", "allgatherv", "gatherv",
           "scatterv", "alltoallv")
NB_OK = ("allreduce", "reduce", "bcast", "allgather", "gather", "scatter", "alltoall",
         "reduce_scatter_block", "reduce_scatter", "scan", "exscan", "allgatherv",
         "gatherv", "scatterv", "alltoallv", "barrier")
GUARD = 3                                   # guard elements around every buffer
# environments the ranks start with: protocol thresholds moved so that small and odd
# counts cross them (segments that are no multiple of the item size, direct reads of a
# few bytes, slots of 256 B, 4 KiB rings)
VARIANTS = {
    "": {},
    "tiny": {"PYCOMM_EAGER_LIMIT": "64", "PYCOMM_SEGMENT_BYTES": "24",
             "PYCOMM_RING_SEGMENT_BYTES": "24", "PYCOMM_HALVING_SEGMENT_BYTES": "24",
             "PYCOMM_SHM_RING_BYTES": "4096"},
    "odd": {"PYCOMM_EAGER_LIMIT": "1000", "PYCOMM_SEGMENT_BYTES": "100",
            "PYCOMM_RING_SEGMENT_BYTES": "52", "PYCOMM_HALVING_SEGMENT_BYTES": "36",
            "PYCOMM_SHM_COLL_BYTES": "256", "PYCOMM_SCRATCH_KEEP_BYTES": "0"},
    "direct": {"PYCOMM_SHM_DIRECT_BYTES": "1", "PYCOMM_SHM_COLL_BYTES": "64"},
    "noslots": {"PYCOMM_SHM_COLL_BYTES": "0", "PYCOMM_SHM_RING_BYTES": "8192"},
}


# -- user ops (made on the ranks) ----------------------------------------------------------

def _affine(invec, inoutvec):
    """(a1, b1) ∘ (a2, b2) = x -> a2 (a1 x + b1) + b2: associative, not commutative."""
    a = invec["a"] * inoutvec["a"]
    b = inoutvec["a"] * invec["b"] + inoutvec["b"]
    inoutvec["a"] = a
    inoutvec["b"] = b


def _user_sum(invec, inoutvec):
    np.add(invec, inoutvec, out=inoutvec)


def _affine_ref(x, y):
    out = np.empty_like(x)
    out["a"] = x["a"] * y["a"]
    out["b"] = y["a"] * x["b"] + y["b"]
    return out


def _loc_ref(x, y, maxloc: bool):
    better = np.greater if maxloc else np.less
    take_x = better(x["val"], y["val"]) | ((x["val"] == y["val"]) & (x["idx"] < y["idx"]))
    return np.where(take_x, x, y)


# -- inputs ---------------------------------------------------------------------------------

def make_input(seed, step, wrank, part, count, dtype, opname, mode):
    """Rank ``wrank``'s input for a step (same bits on every rank that rebuilds it)."""
    rng = np.random.default_rng([seed, step, wrank, part])
    if dtype == "affine":
        out = np.empty(count, AFFINE)
        out["a"] = rng.integers(-2**62, 2**62, count) | 1
        out["b"] = rng.integers(-2**62, 2**62, count)
        return out
    if dtype.startswith("pair:"):
        dt = pycomm.ops.pair_dtype(dtype[5:])
        out = np.empty(count, dt)
        out["val"] = rng.integers(-3, 4, count).astype(dtype[5:])   # ties on purpose
        out["idx"] = rng.integers(0, 5, count) * 16 + wrank          # ties of index too
        return out
    dt = np.dtype(dtype)
    logical = opname in ("LAND", "LOR", "LXOR")
    if dt.kind == "b":
        return rng.integers(0, 2, count).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if logical:
            return (rng.integers(0, 2, count) * rng.integers(1, 100, count)).astype(dt)
        if opname == "PROD" and rng.random() < 0.5:
            return rng.integers(-3 if dt.kind == "i" else 0, 4, count).astype(dt)
        return rng.integers(info.min, info.max, count, dtype=dt, endpoint=True)
    if dt.kind == "f":
        if logical:
            return (rng.integers(0, 2, count) * rng.uniform(-2, 2, count)).astype(dt)
        if mode == "exact":
            if opname == "PROD":
                return (rng.choice([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0], count)).astype(dt)
            return (rng.integers(-64, 65, count) / 8.0).astype(dt)
        if opname == "PROD":
            return (rng.uniform(0.5, 2.0, count) * rng.choice([-1, 1], count)).astype(dt)
        return rng.uniform(-1, 1, count).astype(dt)
    # complex
    if opname == "PROD":
        re = rng.integers(-1, 2, count)
        im = rng.integers(-1, 2, count)
        im[(re == 0) & (im == 0)] = 1
    else:
        re = rng.integers(-64, 65, count) / 8.0
        im = rng.integers(-64, 65, count) / 8.0
    return (re + 1j * im).astype(dt)


def reduce_ref(xs, opname, dtype):
    """Left-to-right reduction of ``xs`` (rank order). Floats: also |x| sums for tolerance."""
    if dtype == "affine":
        acc = xs[0]
        for x in xs[1:]:
            acc = _affine_ref(acc, x)
        return acc
    if dtype.startswith("pair:"):
        acc = xs[0]
        for x in xs[1:]:
            acc = _loc_ref(acc, x, opname == "MAXLOC")
        return acc
    dt = np.dtype(dtype)
    if dt.kind in "fc" and opname in ("SUM", "PROD"):
        acc = xs[0].astype(np.complex128 if dt.kind == "c" else np.float64)
        for x in xs[1:]:
            acc = UFUNCS[opname](acc, x.astype(acc.dtype))
        return acc
    acc = xs[0].copy()
    with np.errstate(all="ignore"):
        for x in xs[1:]:
            acc = UFUNCS[opname](acc, x).astype(dt)
    return acc


def compare(got, want, xs, opname, dtype, mode) -> str | None:
    """None when ``got`` is right, else a short description of the first difference."""
    got = np.asarray(got)
    if got.shape != np.shape(want):
        return f"shape {got.shape} != {np.shape(want)}"
    if got.size == 0:
        return None
    isfloat = dtype in FLOAT_DTYPES + CPLX_DTYPES and opname in ("SUM", "PROD")
    if isinstance(xs, str):                         # "bytes": the same bytes
        isfloat, opname = False, None
    if not isfloat or mode == "exact":
        if dtype in FLOAT_DTYPES + CPLX_DTYPES and opname in ("SUM", "PROD"):
            bad = got != np.asarray(want).astype(got.dtype)
        elif got.dtype.names is not None:
            bad = got.view(np.uint8).reshape(got.size, -1) != \
                np.asarray(want).astype(got.dtype).view(np.uint8).reshape(got.size, -1)
            bad = bad.any(axis=1)
        else:
            bad = got.view(np.uint8).reshape(got.size, -1) != \
                np.asarray(want, dtype=got.dtype).view(np.uint8).reshape(got.size, -1)
            bad = bad.any(axis=1)
    else:
        n = len(xs)
        eps = float(np.finfo(np.dtype(dtype)).eps)
        if opname == "SUM":
            mag = sum(np.abs(x.astype(np.complex128 if np.dtype(dtype).kind == "c"
                                      else np.float64)) for x in xs)
            tol = (n + 1) * eps * mag
        else:
            tol = 2 * (n + 1) * eps * np.abs(want)
        with np.errstate(all="ignore"):
            bad = ~(np.abs(got.astype(np.complex128) - want) <= tol + 1e-300)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        return f"{int(np.count_nonzero(bad))}/{got.size} wrong, first at {i}: " \
               f"got {got.reshape(-1)[i]!r} want {np.asarray(want).reshape(-1)[i]!r}"
    return None


# -- the program ----------------------------------------------------------------------------

def _comm_specs(prog, size):
    """The communicators of a case: (name, members in comm-rank order per world rank)."""
    specs = [("world", {r: list(range(size)) for r in range(size)})]
    if size >= 2:
        ncolors = int(prog.integers(1, min(size, 3) + 1))
        colors = [int(prog.integers(0, ncolors)) for _ in range(size)]
        keys = [int(k) for k in prog.permutation(size)] if prog.random() < 0.7 \
            else [0] * size
        members = {}
        for r in range(size):
            group = [q for q in range(size) if colors[q] == colors[r]]
            group.sort(key=lambda q: (keys[q], q))
            members[r] = group
        specs.append(("split", members, colors, keys))
        k = int(prog.integers(max(1, size // 2), size + 1))
        sub = [int(q) for q in prog.permutation(size)[:k]]     # reordered
        specs.append(("group", {r: sub for r in sub}, sub, bool(prog.random() < 0.5)))
    return specs


def _hosts_spec(hrng, size):
    """The world again, its ranks spread over 2-3 emulated hosts (an uneven, interleaved
    host map): the hierarchical and 2-D algorithms' own schedules on real transports. Drawn
    from its own generator, so that adding it left the other draws of a seed as they were."""
    nh = int(hrng.integers(2, min(size, 3) + 1))
    hostmap = [int(h) for h in hrng.integers(0, nh, size)]
    return ("hosts", {r: list(range(size)) for r in range(size)}, hostmap)


def _build_comms(comm, specs):
    comms = [comm]
    for spec in specs[1:]:
        if spec[0] == "hosts":
            from pycomm.launch.bootstrap import host_layout
            c = comm.Dup()
            c.host_layout = host_layout([{"host": f"h{h}/fuzz/shm", "hostname": f"node{h}"}
                                         for h in spec[2]], c.rank)
            comms.append(c)
        elif spec[0] == "split":
            comms.append(comm.Split(spec[2][comm.rank], spec[3][comm.rank]))
        else:
            g = comm.Get_group().Incl(spec[2])
            if spec[3]:                              # Create_group: only the members call
                c = comm.Create_group(g) if comm.rank in spec[2] else pycomm.COMM_NULL
            else:                                    # Create: every rank calls
                c = comm.Create(g)
            comms.append(c)
    return comms


MAX_BYTES = [8 * 1024 * KIB]                 # per buffer; fuzz_task's max_bytes sets it


def _pick_count(prog, itemsize, nblocks):
    """Elements per block: mostly small, sometimes around a threshold, rarely MiBs."""
    r = prog.random()
    if r < 0.55:
        return int(prog.choice(SMALL_COUNTS))
    mark = int(prog.choice(BYTE_MARKS if r < 0.97 else (2 * 1024 * KIB, 3 * 1024 * KIB)))
    per = mark // max(1, nblocks if prog.random() < 0.5 else 1)
    n = per // itemsize + int(prog.choice([-1, 0, 1]))
    limit = MAX_BYTES[0] // (itemsize * max(1, nblocks))
    return max(0, min(n, limit))


def _pick_dtype_op(prog, coll):
    if coll in COPYING:
        r = prog.random()
        if r < 0.1:
            return "pair:" + str(prog.choice(PAIR_VALUES)), None
        return str(prog.choice(ALL_DTYPES)), None
    r = prog.random()
    if r < 0.12:
        return "pair:" + str(prog.choice(PAIR_VALUES)), str(prog.choice(["MAXLOC", "MINLOC"]))
    if r < 0.24:
        return "affine", "AFFINE"
    dtype = str(prog.choice(ALL_DTYPES))
    return dtype, str(prog.choice(OPS_BY_KIND[np.dtype(dtype).kind]))


def _np_dtype(dtype):
    if dtype == "affine":
        return AFFINE
    if dtype.startswith("pair:"):
        return pycomm.ops.pair_dtype(dtype[5:])
    return np.dtype(dtype)


class _Buffers:
    """Receive/send buffers as slices of larger arrays, with guards; reused between steps."""

    def __init__(self, rng):
        self.rng = rng
        self.pool = {}
        self.busy = set()

    def release(self):
        self.busy.clear()

    def get(self, dtype, n):
        dt = _np_dtype(dtype)
        off = int(self.rng.integers(0, 3))
        key = (str(dt), n, off)
        base = self.pool.get(key) if self.rng.random() < 0.5 else None
        if base is None or id(base) in self.busy:
            base = np.zeros(n + off + GUARD, dt)
            self.pool[key] = base
        self.busy.add(id(base))
        base.view(np.uint8)[:] = 0xA5
        return base, base[off:off + n], off

    @staticmethod
    def guards_ok(base, off, n):
        raw = base.view(np.uint8)
        isz = base.dtype.itemsize
        return bool(np.all(raw[:off * isz] == 0xA5) and np.all(raw[(off + n) * isz:] == 0xA5))


def _op_object(opname, user_ops):
    if opname in user_ops:
        return user_ops[opname]
    return getattr(pycomm, opname)


def plan_step(prog, size, specs, colls):
    """One step's parameters, drawn from the program generator (same on every rank)."""
    coll = str(prog.choice(colls))
    ci = int(prog.integers(0, len(specs)))
    if coll == "p2p":
        return dict(coll=coll, ci=ci, nmsg=int(prog.integers(1, 4)),
                    shift=int(prog.integers(1, max(2, size))),
                    count=_pick_count(prog, 8, 1), dtype=str(prog.choice(ALL_DTYPES)),
                    tag=int(prog.integers(0, 3)), order=int(prog.integers(0, 3)),
                    sendrecv=bool(prog.random() < 0.3))
    if coll == "mpi":
        return dict(coll=coll, ci=0, which=str(prog.choice(
            ["Allreduce", "Reduce", "Scan", "Exscan", "Reduce_scatter_block", "Allgather"])),
            root=int(prog.integers(0, size)), count=_pick_count(prog, 16, 1))
    if coll == "objects":
        return dict(coll=coll, ci=ci, which=str(prog.choice(
            ["bcast", "allreduce", "gather", "allgather", "alltoall", "scatter", "reduce",
             "scan", "exscan"])), root=int(prog.integers(0, size)))
    dtype, opname = _pick_dtype_op(prog, coll)
    isz = _np_dtype(dtype).itemsize
    nb = size if coll in ("allgather", "gather", "scatter", "alltoall",
                          "reduce_scatter_block", "allgatherv", "gatherv", "scatterv",
                          "alltoallv", "reduce_scatter") else 1
    count = _pick_count(prog, isz, nb)
    if coll == "barrier":
        algs = pycomm.algorithms("barrier")
    else:
        algs = pycomm.algorithms(coll)
    alg = None if prog.random() < 0.4 else str(prog.choice(algs))
    return dict(coll=coll, ci=ci, dtype=dtype, op=opname, count=count,
                root=int(prog.integers(0, size)), alg=alg,
                inplace=bool(prog.random() < 0.3), mode=str(prog.choice(["exact", "random"])),
                vcounts=[int(x) for x in prog.integers(0, 3, size)],
                vseed=int(prog.integers(0, 2**31)))


def _vcounts(p, n):
    base = p["count"]
    return [((p["vcounts"][i % len(p["vcounts"])]) * base) // 2 + (i % 2) for i in range(n)]


def exec_coll(comm, members, p, seed, step, bufs, user_ops, nb):
    """Post (or run) one buffer collective; return (request or None, checker)."""
    n, r = comm.size, comm.rank
    coll, dtype, opname, mode = p["coll"], p["dtype"], p["op"], p["mode"]
    root = p["root"] % n
    count = p["count"]
    kw = {} if p["alg"] is None else {"algorithm": p["alg"]}
    inp = lambda q, part=0, c=count: make_input(seed, step, members[q], part, c, dtype,  # noqa
                                                opname, mode)
    op = _op_object(opname, user_ops) if opname else None
    inplace = p["inplace"]
    IP = pycomm.IN_PLACE
    checks = []                                     # (label, got, want, xs, exact)
    guards = []
    call = None

    def rbuf(m):
        base, view, off = bufs.get(dtype, m)
        guards.append((base, off, m))
        return view

    def sbuf(arr):
        base, view, off = bufs.get(dtype, arr.size)
        view[...] = arr
        guards.append((base, off, arr.size))
        return view

    if coll == "barrier":
        call = ("Ibarrier" if nb else "Barrier", (), kw)
    elif coll == "allreduce":
        x = inp(r)
        recv = rbuf(count)
        if inplace:
            recv[...] = x
            args = (IP, recv, op)
        else:
            args = (sbuf(x), recv, op)
        call = ("Iallreduce" if nb else "Allreduce", args, kw)
        xs = [inp(q) for q in range(n)]
        checks.append(("result", recv, lambda: reduce_ref(xs, opname, dtype), xs))
    elif coll == "reduce":
        x = inp(r)
        recv = rbuf(count)
        if inplace and r == root:
            recv[...] = x
            args = (IP, recv, op, root)
        else:
            args = (sbuf(x), recv if r == root else (recv if p["vseed"] % 2 else None), op, root)
        call = ("Ireduce" if nb else "Reduce", args, kw)
        if r == root:
            xs = [inp(q) for q in range(n)]
            checks.append(("result", recv, lambda: reduce_ref(xs, opname, dtype), xs))
    elif coll == "bcast":
        buf = rbuf(count)
        if r == root:
            buf[...] = inp(root)
        call = ("Ibcast" if nb else "Bcast", (buf, root), kw)
        checks.append(("result", buf, lambda: inp(root), None))
    elif coll == "allgather":
        recv = rbuf(count * n)
        if inplace:
            recv[r * count:(r + 1) * count] = inp(r)
            args = (IP, recv)
        else:
            args = (sbuf(inp(r)), recv)
        call = ("Iallgather" if nb else "Allgather", args, kw)
        checks.append(("result", recv, lambda: np.concatenate([inp(q) for q in range(n)]),
                       None))
    elif coll == "gather":
        recv = rbuf(count * n) if r == root else None
        if inplace and r == root:
            recv[r * count:(r + 1) * count] = inp(r)
            args = (IP, recv, root)
        else:
            args = (sbuf(inp(r)), recv, root)
        call = ("Igather" if nb else "Gather", args, kw)
        if r == root:
            checks.append(("result", recv,
                           lambda: np.concatenate([inp(q) for q in range(n)]), None))
    elif coll == "scatter":
        send = None
        recv = rbuf(count)
        if r == root:
            send = sbuf(inp(root, 0, count * n))
        if inplace and r == root:
            args = (send, IP, root)
            checks.append(("result", send, lambda: inp(root, 0, count * n), None))
        else:
            args = (send, recv, root)
            checks.append(("result", recv,
                           lambda: inp(root, 0, count * n)[r * count:(r + 1) * count], None))
        call = ("Iscatter" if nb else "Scatter", args, kw)
    elif coll == "alltoall":
        recv = rbuf(count * n)
        if inplace:
            recv[...] = inp(r, 0, count * n)
            args = (IP, recv)
        else:
            args = (sbuf(inp(r, 0, count * n)), recv)
        call = ("Ialltoall" if nb else "Alltoall", args, kw)
        checks.append(("result", recv, lambda: np.concatenate(
            [inp(q, 0, count * n)[r * count:(r + 1) * count] for q in range(n)]), None))
    elif coll == "reduce_scatter_block":
        x = inp(r, 0, count * n)
        recv = rbuf(count * n if inplace else count)
        if inplace:
            recv[...] = x
            args = (IP, recv, op)
        else:
            args = (sbuf(x), recv, op)
        call = ("Ireduce_scatter_block" if nb else "Reduce_scatter_block", args, kw)
        xs = [inp(q, 0, count * n)[r * count:(r + 1) * count] for q in range(n)]
        checks.append(("result", recv[:count], lambda: reduce_ref(xs, opname, dtype), xs))
    elif coll == "reduce_scatter":
        counts = _vcounts(p, n)
        total = sum(counts)
        lo = sum(counts[:r])
        x = inp(r, 0, total)
        if inplace:
            recv = rbuf(total)
            recv[...] = x
            args = (IP, recv, counts, op)
        else:
            recv = rbuf(counts[r])
            # recvcounts None: each rank's recvbuf size, agreed by an Allgather first
            args = (sbuf(x), recv, None if p.get("nocounts") else counts, op)
        call = ("Ireduce_scatter" if nb else "Reduce_scatter", args, kw)
        xs = [inp(q, 0, total)[lo:lo + counts[r]] for q in range(n)]
        checks.append(("result", recv[:counts[r]], lambda: reduce_ref(xs, opname, dtype),
                       xs))
    elif coll in ("scan", "exscan"):
        x = inp(r)
        recv = rbuf(count)
        if inplace:
            recv[...] = x
            args = (IP, recv, op)
        else:
            args = (sbuf(x), recv, op)
        name = coll.capitalize()
        call = (("I" + coll) if nb else name, args, kw)
        upto = r + 1 if coll == "scan" else r
        if upto == 0:                               # Exscan leaves rank 0's recvbuf
            before = recv.copy()
            checks.append(("rank 0's recvbuf untouched", recv, lambda: before, "bytes"))
        if upto > 0:
            xs = [inp(q) for q in range(upto)]
            checks.append(("result", recv, lambda: reduce_ref(xs, opname, dtype), xs))
    elif coll in ("allgatherv", "gatherv"):
        counts = _vcounts(p, n)
        displs = list(itertools.accumulate([0] + counts[:-1]))
        if p["vseed"] % 3 == 0:                 # reversed blocks with gaps
            displs, at = [0] * n, 1
            for i in reversed(range(n)):
                displs[i] = at
                at += counts[i] + 1
            total = at
        else:
            total = sum(counts)
        mine = inp(r, 0, counts[r])
        isroot = coll == "allgatherv" or r == root
        recv = rbuf(total) if isroot else None
        if isroot:
            recv[...] = np.zeros(1, _np_dtype(dtype))
        spec = [recv, counts, displs] if isroot else None
        if inplace and isroot:
            recv[displs[r]:displs[r] + counts[r]] = mine
            send = IP
        else:
            send = sbuf(mine)
        if coll == "allgatherv":
            call = ("Iallgatherv" if nb else "Allgatherv", (send, spec), kw)
        else:
            call = ("Igatherv" if nb else "Gatherv", (send, spec, root), kw)
        if isroot:
            def want():
                w = np.zeros(total, _np_dtype(dtype))
                for q in range(n):
                    w[displs[q]:displs[q] + counts[q]] = inp(q, 0, counts[q])
                return w
            checks.append(("result", recv, want, None))
    elif coll == "scatterv":
        counts = _vcounts(p, n)
        displs = list(itertools.accumulate([0] + counts[:-1]))
        total = sum(counts)
        full = inp(root, 0, total)
        send = [sbuf(full), counts, displs] if r == root else None
        if inplace and r == root:
            call = ("Iscatterv" if nb else "Scatterv", (send, IP, root), kw)
        else:
            recv = rbuf(counts[r])
            call = ("Iscatterv" if nb else "Scatterv", (send, recv, root), kw)
            checks.append(("result", recv, lambda: full[displs[r]:displs[r] + counts[r]],
                           None))
    elif coll == "alltoallv":
        # send count from q to t: cnt(q, t)
        def cnt(q, t):
            return ((q * 3 + t * 5 + p["vseed"]) % 3) * count // 2 + ((q + t) % 2)
        scounts = [cnt(r, t) for t in range(n)]
        rcounts = [cnt(q, r) for q in range(n)]
        sd = list(itertools.accumulate([0] + scounts[:-1]))
        rd = list(itertools.accumulate([0] + rcounts[:-1]))
        send = sbuf(inp(r, 0, sum(scounts)))
        recv = rbuf(sum(rcounts))
        call = ("Ialltoallv" if nb else "Alltoallv", ([send, scounts, sd], [recv, rcounts, rd]),
                kw)

        def want():
            parts = []
            for q in range(n):
                sc = [cnt(q, t) for t in range(n)]
                off = sum(sc[:r])
                parts.append(inp(q, 0, sum(sc))[off:off + sc[r]])
            return np.concatenate(parts) if parts else np.zeros(0, _np_dtype(dtype))
        checks.append(("result", recv, want, None))
    else:
        raise AssertionError(coll)
    name, args, kw = call
    req = getattr(comm, name)(*args, **kw)
    return req, checks, guards


def run_checks(checks, guards, p):
    errs = []
    for label, got, want, xs in checks:
        w = want()
        e = compare(got, w, xs, p.get("op"), p.get("dtype", ""), p.get("mode"))
        if e:
            errs.append(f"{label}: {e}")
    for base, off, m in guards:
        if not _Buffers.guards_ok(base, off, m):
            errs.append("guard bytes around a buffer were overwritten")
    return errs


def exec_p2p(comm, members, p, seed, step, rng):
    n, r = comm.size, comm.rank
    if n < 2:
        return []
    k = p["shift"] % n or 1
    dst, src = (r + k) % n, (r - k) % n
    dtype, count = p["dtype"], p["count"] // max(1, p["nmsg"])
    errs = []
    mk = lambda q, i: make_input(seed, step, members[q], 100 + i, count, dtype, None, "exact")  # noqa
    if p["sendrecv"]:
        recv = np.empty(count, dtype)
        comm.Sendrecv(mk(r, 0), dst, p["tag"], recv, src, p["tag"])
        if not np.array_equal(recv, mk(src, 0)):
            errs.append(f"Sendrecv from {src} wrong")
        return errs
    sends = [comm.Isend(mk(r, i), dst, tag=p["tag"]) for i in range(p["nmsg"])]
    extra = p.get("extra", 0)       # a receive buffer longer than the message
    isz = np.dtype(dtype).itemsize
    bases = [np.full((count + extra) * isz, 0x5A, np.uint8) for _ in range(p["nmsg"])]
    full = [b.view(dtype) for b in bases]
    recvs = [f[:count] for f in full]
    if p["order"] == 0:
        reqs = [comm.Irecv(b, src, tag=p["tag"]) for b in recvs]
        order = list(rng.permutation(len(reqs)))
        for i in order:
            reqs[i].Wait()
    elif p["order"] == 1:
        for b in recvs:
            comm.Recv(b, src, tag=p["tag"])
    else:
        for i, b in enumerate(full):
            st = pycomm.Status()
            if p.get("probe"):
                comm.Probe(src, tag=p["tag"], status=st)
                if st.Get_count(dtype) != count or st.Get_source() != src:
                    errs.append(f"Probe of message {i}: count {st.Get_count(dtype)} source "
                                f"{st.Get_source()}, want {count} from {src}")
                st = pycomm.Status()
            comm.Recv(b, pycomm.ANY_SOURCE if k * 2 == n or n == 2 else src,
                      tag=pycomm.ANY_TAG if n == 2 else p["tag"], status=st)
            if (st.Get_source(), st.Get_tag(), st.Get_count(dtype)) != (src, p["tag"], count):
                errs.append(f"status of message {i}: (source, tag, count) "
                            f"{(st.Get_source(), st.Get_tag(), st.Get_count(dtype))}, want "
                            f"{(src, p['tag'], count)}")
    for i in rng.permutation(len(sends)):
        sends[i].Wait()
    for i, b in enumerate(recvs):
        if not np.array_equal(b.view(np.uint8), mk(src, i).view(np.uint8)):
            errs.append(f"message {i} from {src} wrong (non-overtaking or content)")
        if not np.all(bases[i][count * isz:] == 0x5A):
            errs.append(f"message {i} from {src} wrote past its {count} elements")
    return errs


def exec_objects(comm, members, p, seed, step):
    n, r = comm.size, comm.rank
    root = p["root"] % n
    obj = lambda q: {"r": members[q], "v": [seed % 97, step, members[q] * 3]}  # noqa
    num = lambda q: (members[q] + 1) * (step % 7 + 1)  # noqa
    w = p["which"]
    kind = p.get("objop")
    if kind and w in ("allreduce", "reduce", "scan", "exscan"):
        return _objects_reduce(comm, members, p, seed, step, kind, root)
    if w == "bcast":
        got, want = comm.bcast(obj(root) if r == root else None, root=root), obj(root)
    elif w == "allreduce":
        got, want = comm.allreduce(num(r), op=pycomm.SUM), sum(num(q) for q in range(n))
    elif w == "reduce":
        got = comm.reduce(num(r), op=pycomm.MAX, root=root)
        want = max(num(q) for q in range(n)) if r == root else None
    elif w == "gather":
        got = comm.gather(obj(r), root=root)
        want = [obj(q) for q in range(n)] if r == root else None
    elif w == "allgather":
        got, want = comm.allgather(obj(r)), [obj(q) for q in range(n)]
    elif w == "alltoall":
        got = comm.alltoall([(members[r], t) for t in range(n)])
        want = [(members[q], r) for q in range(n)]
    elif w == "scatter":
        got = comm.scatter([obj(q) for q in range(n)] if r == root else None, root=root)
        want = obj(r)
    elif w == "scan":
        got, want = comm.scan([members[r]]), [members[q] for q in range(r + 1)]
    else:
        got = comm.exscan([members[r]])
        want = [members[q] for q in range(r)] if r > 0 else None
        if r == 0:
            return []
    return [] if got == want else [f"object {w}: got {got!r} want {want!r}"]


def _concat(a, b):
    return a + b


def _objects_reduce(comm, members, p, seed, step, kind, root):
    """Object reductions: list concatenation (a non-commutative user op), MAXLOC on
    (value, index) tuples with ties, SUM of numpy arrays, BXOR of ints."""
    n, r = comm.size, comm.rank
    w = p["which"]

    def val(q):
        rng = np.random.default_rng([seed, step, members[q], 55])
        if kind == "concat":
            return [members[q]] * int(rng.integers(0, 3))
        if kind == "maxloc":
            return (int(rng.integers(0, 3)), members[q])
        if kind == "array":
            return rng.integers(-9, 9, 3 + step % 5)
        return int(rng.integers(0, 2**62))
    if kind == "concat":
        op = pycomm.Op.Create(_concat, commute=False)
        fold = _concat
    elif kind == "maxloc":
        op = pycomm.MAXLOC
        fold = pycomm.MAXLOC.reduce_objects
    elif kind == "array":
        op, fold = pycomm.SUM, (lambda a, b: a + b)
    else:
        op, fold = pycomm.BXOR, (lambda a, b: a ^ b)
    try:
        upto = {"allreduce": n, "reduce": n, "scan": r + 1, "exscan": r}[w]
        if w == "reduce":
            got = comm.reduce(val(r), op=op, root=root)
        else:
            got = getattr(comm, w)(val(r), op=op)
    finally:
        if kind == "concat":
            op.Free()
    if (w == "reduce" and r != root) or upto == 0:
        return []
    want = val(0)
    for q in range(1, upto):
        want = fold(want, val(q))
    if kind == "array":
        same = isinstance(got, np.ndarray) and np.array_equal(got, want)
    else:
        same = got == want
    return [] if same else [f"object {w} ({kind}): got {got!r} want {want!r}"]


def _mpi_affine(inbuf, inoutbuf, datatype):
    """The affine op on pairs of int64 (an MPI contiguous type of two), mpi4py's form."""
    x = np.asarray(inbuf).view(np.int64).reshape(-1, 2)
    y = np.asarray(inoutbuf).view(np.int64).reshape(-1, 2)
    a = x[:, 0] * y[:, 0]
    b = y[:, 0] * x[:, 1] + y[:, 1]
    y[:, 0] = a
    y[:, 1] = b


def exec_mpi(p, seed, step, state):
    """A reduction through pycomm.MPI (mpi4py's API): a user op on a derived datatype."""
    from pycomm import MPI
    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    if "T2" not in state:
        state["T2"] = MPI.INT64_T.Create_contiguous(2).Commit()
        state["op"] = MPI.Op.Create(_mpi_affine, commute=False)
    T2, op = state["T2"], state["op"]
    count, root = p["count"], p["root"] % n
    w = p["which"]
    m = count * (n if w == "Reduce_scatter_block" else 1)

    def inp(q):
        return make_input(seed, step, q, 0, m, "affine", None, "exact").view(np.int64).copy()

    out = np.full(2 * (count if w != "Allgather" else count * n), 7, np.int64)
    if w == "Allreduce":
        comm.Allreduce([inp(r), count, T2], [out, count, T2], op=op)
        xs, want = range(n), True
    elif w == "Reduce":
        comm.Reduce([inp(r), count, T2], [out, count, T2], op=op, root=root)
        xs, want = range(n), r == root
    elif w == "Scan":
        comm.Scan([inp(r), count, T2], [out, count, T2], op=op)
        xs, want = range(r + 1), True
    elif w == "Exscan":
        comm.Exscan([inp(r), count, T2], [out, count, T2], op=op)
        xs, want = range(r), r > 0
    elif w == "Reduce_scatter_block":
        comm.Reduce_scatter_block([inp(r), count * n, T2], [out, count, T2], op=op)
        xs, want = range(n), True
    else:
        comm.Allgather([inp(r), count, T2], [out, count, T2])
        ref = np.concatenate([inp(q) for q in range(n)])
        return [] if np.array_equal(out, ref) else ["MPI Allgather T2 wrong"]
    if not want:
        return []
    acc = None
    for q in xs:
        y = inp(q).view(AFFINE)
        if w == "Reduce_scatter_block":
            y = y[r * count:(r + 1) * count]
        acc = y if acc is None else _affine_ref(acc, y)
    if not np.array_equal(out.view(AFFINE), acc):
        bad = np.flatnonzero(out.view(AFFINE) != acc)
        return [f"MPI {w} with a non-commutative user op on a contiguous(2) type: "
                f"{bad.size}/{count} wrong, first at {bad[0]}"]
    return []


def exec_mpi_vector(p, seed, step):
    """pycomm.MPI with strided datatypes: a column of a row-major matrix (a vector type
    resized to one element, so that consecutive items are consecutive columns), packed
    and unpacked around the collective: Bcast, Allreduce (SUM, exact on int64), Gather."""
    from pycomm import MPI
    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    rows = max(1, p["count"] % 97)
    cols = 3 + p["root"] % 4
    col = MPI.INT64_T.Create_vector(rows, 1, cols).Create_resized(0, 8).Commit()
    try:
        def mat(q):
            return make_input(seed, step, q, 7, rows * cols, "int64", "BXOR", "exact")
        ncol = 1 + p["count"] % (cols - 1)          # columns moved, from column 1 on
        w = p["which"]
        root = p["root"] % n
        a = mat(r).copy()
        if w == "BcastVec":
            comm.Bcast([a[1:], ncol, col], root=root)
            want = mat(r).reshape(rows, cols).copy()
            want[:, 1:1 + ncol] = mat(root).reshape(rows, cols)[:, 1:1 + ncol]
        elif w == "AllreduceVec":
            out = np.full(rows * cols, 5, np.int64)
            comm.Allreduce([a[1:], ncol, col], [out[1:], ncol, col], op=MPI.SUM)
            a = out
            want = np.full((rows, cols), 5, np.int64)
            with np.errstate(all="ignore"):
                want[:, 1:1 + ncol] = sum(mat(q).reshape(rows, cols)[:, 1:1 + ncol]
                                          for q in range(n))
        else:                                       # GatherVec: rank q's column -> column q
            out = np.full(rows * n, 5, np.int64)
            gcol = MPI.INT64_T.Create_vector(rows, 1, n).Create_resized(0, 8).Commit()
            try:
                comm.Gather([a[1:], 1, col], [out, 1, gcol] if r == root else None,
                            root=root)
            finally:
                gcol.Free()
            if r != root:
                return []
            a = out
            want = np.stack([mat(q).reshape(rows, cols)[:, 1] for q in range(n)], 1)
        if not np.array_equal(a.reshape(-1), want.reshape(-1)):
            return [f"MPI {w} on a vector type ({rows}x{cols}, {ncol} columns) wrong"]
        return []
    finally:
        col.Free()


def _digest(arr):
    return hashlib.blake2b(np.ascontiguousarray(arr).view(np.uint8).tobytes(),
                           digest_size=8).hexdigest()


def fuzz_task(seed, steps, colls=None, max_bytes=8 * 1024 * KIB):
    """On a rank: run case ``seed``; return its per-step records."""
    MAX_BYTES[0] = max_bytes
    comm = pycomm.COMM_WORLD
    size, me = comm.size, comm.rank
    prog = np.random.default_rng([seed, 0xF022])
    local = np.random.default_rng([seed, 0xF022, me])
    colls = colls or (list(REDUCING) * 2 + list(COPYING) + ["barrier", "p2p", "objects",
                                                             "nb_group", "p2p",
                                                             "mpi"])
    specs = _comm_specs(prog, size)
    hrng = np.random.default_rng([seed, 0x4057])      # same on every rank
    base = list(specs)                                 # what plan_step draws from
    if size >= 2:
        specs.append(_hosts_spec(hrng, size))
    comms = _build_comms(comm, specs)
    user_ops = {"AFFINE": pycomm.Op.Create(_affine, commute=False),
                "USER_SUM": pycomm.Op.Create(_user_sum, commute=True)}
    bufs = _Buffers(local)
    mpi_state = {}
    records = []
    try:
        for step in range(steps):
            coll = str(prog.choice(colls))
            if coll == "nb_group":
                k = int(prog.integers(2, 5))
                plans = [plan_step(prog, size, base, [c for c in colls if c in NB_OK])
                         for _ in range(k)]
            else:
                plans = [plan_step(prog, size, base, [coll])]
            for p in plans:                 # a fifth of the calls on the emulated hosts
                if size >= 2 and hrng.random() < 0.2 and p["coll"] != "mpi":
                    p["ci"] = len(specs) - 1
                if p["coll"] == "objects":
                    p["objop"] = str(hrng.choice(["", "concat", "maxloc", "array", "bxor"]))
                if p["coll"] == "reduce_scatter":
                    p["nocounts"] = bool(hrng.random() < 0.3)
                if p["coll"] == "p2p":      # longer receive buffers, probes
                    p["extra"] = int(hrng.choice([0, 0, 1, 7, 9000]))
                    p["probe"] = bool(hrng.random() < 0.3)
                if p["coll"] == "mpi" and hrng.random() < 0.4:     # strided datatypes
                    p["which"] = str(hrng.choice(["BcastVec", "AllreduceVec", "GatherVec"]))
            rec = {"step": step, "plans": plans, "errs": [], "exc": None, "digests": []}
            records.append(rec)
            posted = []
            bufs.release()
            for j, p in enumerate(plans):
                c = comms[p["ci"]]
                if c == pycomm.COMM_NULL or c is None:
                    continue
                members = specs[p["ci"]][1][me]
                sub = step * 10 + j
                try:
                    if p["coll"] == "p2p":
                        rec["errs"] += exec_p2p(c, members, p, seed, sub, local)
                    elif p["coll"] == "objects":
                        rec["errs"] += exec_objects(c, members, p, seed, sub)
                    elif p["coll"] == "mpi" and p["which"].endswith("Vec"):
                        rec["errs"] += exec_mpi_vector(p, seed, sub)
                    elif p["coll"] == "mpi":
                        rec["errs"] += exec_mpi(p, seed, sub, mpi_state)
                    else:
                        # a blocking call may meet its nonblocking twin on other ranks
                        # (in a group of outstanding nonblocking calls too: a blocking
                        # call on one rank among another communicator's pending ones)
                        nb = local.random() < (0.8 if coll == "nb_group" else 0.25)
                        req, checks, guards = exec_coll(c, members, p, seed, sub, bufs,
                                                        user_ops, nb)
                        posted.append((req, checks, guards, p, j, members))
                except pycomm.CommError as exc:
                    rec["exc"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            try:
                order = local.permutation(len(posted)) if posted else []
                if coll == "nb_group" and local.random() < 0.3:
                    pycomm.Request.Waitall([x[0] for x in posted if x[0] is not None])
                else:
                    for i in order:
                        if posted[i][0] is not None:
                            posted[i][0].Wait()
            except pycomm.CommError as exc:
                rec["exc"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                for x in posted:                 # every request ends before the next step
                    try:
                        if x[0] is not None:
                            x[0].Wait()
                    except pycomm.CommError:
                        pass
                continue
            bufs.release()
            for req, checks, guards, p, j, members in posted:
                rec["errs"] += run_checks(checks, guards, p)
                if p["coll"] == "allreduce":
                    rec["digests"].append((j, tuple(members), _digest(checks[0][1])))
    finally:
        for op in user_ops.values():
            op.Free()
        if mpi_state:
            mpi_state["op"].Free()
            mpi_state["T2"].Free()
        for c in comms[1:]:
            if c is not None and c != pycomm.COMM_NULL:
                c.Free()
    return records


# -- the driver ----------------------------------------------------------------------------

def check_case(per_rank, specs_size=None) -> list[str]:
    """Problems of one case from every rank's records: wrong results, uneven errors,
    all-reduce results that differ between ranks."""
    problems = []
    nsteps = max(len(x) for x in per_rank)
    for s in range(nsteps):
        recs = [x[s] if s < len(x) else None for x in per_rank]
        for r, rec in enumerate(recs):
            if rec is None:
                continue
            for e in rec["errs"]:
                problems.append(f"step {s} rank {r}: WRONG {e} :: {_brief(rec['plans'])}")
            if rec["exc"] and not _expected_refusal(rec["exc"]):
                problems.append(f"step {s} rank {r}: ERROR {rec['exc']} :: "
                                f"{_brief(rec['plans'])}")
        excs = {r: rec["exc"] for r, rec in enumerate(recs) if rec is not None}
        # allreduce digests: every rank of a communicator the same bits
        seen = {}
        for r, rec in enumerate(recs):
            if rec is None or rec["exc"]:
                continue
            for j, members, d in rec["digests"]:
                seen.setdefault((j, tuple(members)), {}).setdefault(d, []).append(r)
        for key, ds in seen.items():
            if len(ds) > 1:
                problems.append(f"step {s}: ALLREDUCE BITS DIFFER between ranks {ds} "
                                f":: {_brief([recs[ds[next(iter(ds))][0]]['plans'][key[0]]])}")
        _ = excs
    return problems


def _expected_refusal(msg: str) -> bool:
    return msg.startswith("ArgumentError") and ("algorithm" in msg or "not defined" in msg
                                                 or "needs" in msg or "requires" in msg)


def _brief(plans):
    keys = ("coll", "ci", "dtype", "op", "count", "root", "alg", "inplace", "mode")
    return "; ".join(",".join(f"{k}={p[k]}" for k in keys if k in p) for p in plans)


# the tiny segments make a MiB take seconds: smaller buffers there
# (odd: 36-byte halving segments make a 1 MiB reduce-scatter 29k messages, minutes)
VARIANT_MAX_BYTES = {"tiny": 96 * KIB, "odd": 128 * KIB}


def start_pool(size, transport, variant="", timeout=90.0):
    """A Pool whose ranks start with the variant's environment."""
    import os
    env = VARIANTS[variant]
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return pycomm.Pool(size, transport=transport, timeout=timeout)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def replay(size, transport, seed, steps, colls=None, timeout=120.0, variant="",
           max_bytes=None):
    pool = start_pool(size, transport, variant, timeout)
    try:
        res = pool.run(fuzz_task, seed, steps, colls,
                       max_bytes or VARIANT_MAX_BYTES.get(variant, 8 * 1024 * KIB))
        return check_case(res), res
    finally:
        pool.close()


def campaign(minutes, log, seeds_from=0, steps=12, worlds=None, variants=("",)):
    import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    worlds = worlds or [(n, t) for n in (2, 3, 4, 5, 6, 7, 8) for t in ("shm", "tcp")] + \
        [(n, "rdma") for n in (2, 3, 4, 5)]
    worlds = [(n, t, v) for v in variants for n, t in worlds
              if v in ("", "tiny", "odd") or t == "shm"]      # direct, noslots: shm's
    end = time.time() + minutes * 60
    seed = seeds_from
    stats = {"cases": 0, "steps": 0, "problems": 0, "errors": {}}
    per_world = max(1.0, minutes * 60 / len(worlds))
    rounds = 0
    while time.time() < end:
        for size, transport, variant in worlds:
            if time.time() >= end:
                break
            try:
                pool = start_pool(size, transport, variant)
            except Exception as exc:
                print("pool start failed", size, transport, exc, flush=True)
                continue
            wend = min(end, time.time() + per_world / (1 if rounds else 2))
            try:
                while time.time() < wend:
                    seed += 1
                    try:
                        res = pool.run(fuzz_task, seed, steps, None,
                                       VARIANT_MAX_BYTES.get(variant, 8 * 1024 * KIB),
                                       timeout=90.0)
                        probs = check_case(res)
                    except pycomm.CommError as exc:
                        probs = [f"TASK FAILED {type(exc).__name__}: "
                                 f"{str(exc)[:2000]}"]
                        res = None
                    stats["cases"] += 1
                    stats["steps"] += steps
                    if res:
                        for rec in res[0]:
                            if rec["exc"]:
                                k = rec["exc"][:90]
                                stats["errors"][k] = stats["errors"].get(k, 0) + 1
                    if probs:
                        stats["problems"] += 1
                        with open(log, "a") as f:
                            f.write(json.dumps({"size": size, "transport": transport,
                                                "variant": variant,
                                                "seed": seed, "steps": steps,
                                                "problems": probs[:20]}) + "\n")
                        print(f"FAIL n={size} {transport} {variant} seed={seed}: {probs[0][:300]}",
                              flush=True)
                        if res is None:
                            break               # the pool is broken: a new one
            finally:
                try:
                    pool.close()
                except Exception:
                    traceback.print_exc()
            print(f"{time.strftime('%H:%M:%S')} n={size} {transport} {variant}: {stats['cases']} cases,"
                  f" {stats['problems']} failing", flush=True)
        rounds += 1
    print(json.dumps(stats, indent=1))
    return stats


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--log", default="/tmp/fuzz_failures.jsonl")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--replay", nargs=3)
    ap.add_argument("--variant", default="")
    ap.add_argument("--max-bytes", type=int, default=None)
    ap.add_argument("--variants", default="", help="comma list of VARIANTS keys")
    ap.add_argument("--worlds", default=None, help="e.g. 3:shm,5:tcp")
    a = ap.parse_args()
    if a.replay:
        import cloudpickle
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        probs, _ = replay(int(a.replay[0]), a.replay[1], int(a.replay[2]), a.steps,
                          variant=a.variant, max_bytes=a.max_bytes)
        print("\n".join(probs) or "no problem")
    else:
        worlds = None
        if a.worlds:
            worlds = [(int(w.split(":")[0]), w.split(":")[1]) for w in a.worlds.split(",")]
        campaign(a.minutes, a.log, a.seed, a.steps, worlds,
                 tuple(a.variants.split(",")) if a.variants else ("",))
