"""One buffer collective of a differential fuzzing case (tests/fuzzgen.py), posted on
offset slices with guard bytes, blocking or not, and its checks against numpy."""

from __future__ import annotations

import itertools

import numpy as np

import pycomm
from fuzzref import compare, make_input, np_dtype, reduce_ref

GUARD = 3                                   # guard elements around every buffer


class Buffers:
    """Receive/send buffers as slices of larger arrays, with guards; reused between steps."""

    def __init__(self, rng):
        self.rng = rng
        self.pool = {}
        self.busy = set()

    def release(self):
        self.busy.clear()

    def get(self, dtype, n):
        dt = np_dtype(dtype)
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

    def send_recv(x, m, *rest):
        """A receive buffer of ``m`` elements and the call's arguments up to ``rest``:
        IN_PLACE with the input ``x`` in the receive buffer, or a send buffer of ``x``."""
        recv = rbuf(m)
        if inplace:
            recv[...] = x
            return recv, (IP, recv, *rest)
        return recv, (sbuf(x), recv, *rest)

    if coll == "barrier":
        call = ("Ibarrier" if nb else "Barrier", (), kw)
    elif coll == "allreduce":
        recv, args = send_recv(inp(r), count, op)
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
        recv, args = send_recv(inp(r, 0, count * n), count * n)
        call = ("Ialltoall" if nb else "Alltoall", args, kw)
        checks.append(("result", recv, lambda: np.concatenate(
            [inp(q, 0, count * n)[r * count:(r + 1) * count] for q in range(n)]), None))
    elif coll == "reduce_scatter_block":
        recv, args = send_recv(inp(r, 0, count * n), count * n if inplace else count, op)
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
        recv, args = send_recv(inp(r), count, op)
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
            recv[...] = np.zeros(1, np_dtype(dtype))
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
                w = np.zeros(total, np_dtype(dtype))
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
            return np.concatenate(parts) if parts else np.zeros(0, np_dtype(dtype))
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
        if not Buffers.guards_ok(base, off, m):
            errs.append("guard bytes around a buffer were overwritten")
    return errs
