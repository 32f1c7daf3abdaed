"""The other steps of a differential fuzzing case (tests/fuzzgen.py): point-to-point
messages, object collectives (with object reductions) and reductions through pycomm.MPI
(mpi4py's API) with user ops on derived and strided datatypes."""

from __future__ import annotations

import numpy as np

import pycomm
from fuzzref import AFFINE, affine_ref, make_input

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
        acc = y if acc is None else affine_ref(acc, y)
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
