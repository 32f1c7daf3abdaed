"""Vector collectives and prefix reductions on real worlds: Gatherv, Scatterv, Allgatherv,
Alltoallv, Reduce_scatter, Scan and Exscan (buffer forms, every algorithm and the automatic
choice) and the object scan/exscan.

Like test_cco_buf.py: one ``world.run`` per (collective, algorithm) executes a list of
cases; each rank rebuilds every rank's input from seeds, computes the numpy reference and
returns, per case, a label and an error description (None when right). Counts are uneven
with zeros on some ranks, displacements leave gaps (which must stay untouched) and place the
blocks in reverse rank order; every root and every mpi4py vector-spec form is tried.
"""

from __future__ import annotations

import functools
import sys

import cloudpickle
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pycomm
from pycomm.collectives import REGISTRY

cloudpickle.register_pickle_by_value(sys.modules[__name__])

EAGER_LIMIT = 65536
BIG = EAGER_LIMIT // 8 + 3          # int64/float64 elements per unit: rendezvous
SENTINEL = -99
VCOLLS = ("gatherv", "scatterv", "allgatherv", "alltoallv")
REDUCING = ("reduce_scatter", "scan", "exscan")
FORMS = ("counts", "displs", "tuple", "four")      # the mpi4py vector buffer specs
UFUNC = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}


def _pairs(colls) -> list:
    """Every (collective, algorithm) pair, and (collective, None) for the automatic choice.

    A collective missing from the registry fails collection (ArgumentError), not a skip.
    """
    out = []
    for c in colls:
        algs = pycomm.algorithms(c)
        out += [pytest.param((c, a)) for a in algs + ([None] if len(algs) > 1 else [])]
    return out


def _pair_id(pair) -> str:
    return f"{pair[0]}-{pair[1] or 'auto'}"


# -- inputs and specs (run on the ranks) ---------------------------------------------------

def val(seed: int, rank: int, m: int, dtype: str = "int64") -> np.ndarray:
    rng = np.random.default_rng([seed, rank, m])
    if np.dtype(dtype).kind == "f":
        return rng.uniform(0.5, 1.5, m).astype(dtype)
    return rng.integers(-50, 50, m).astype(dtype)


def counts_of(size: int, k: int, seed: int) -> list:
    """Uneven per-rank counts, zero on about a third of the ranks."""
    return [((i * 7 + seed) % 3) * k for i in range(size)]


def layout(counts: list, form: str) -> tuple[list | None, int]:
    """Displacements (None: implicit, contiguous) and the buffer length for a spec form.

    With explicit displacements the blocks go in reverse rank order with a one-element gap
    before each block and after the last.
    """
    if form == "counts":
        return None, sum(counts)
    displs, at = [0] * len(counts), 1
    for i in reversed(range(len(counts))):
        displs[i] = at
        at += counts[i] + 1
    return displs, at


def spec(buf: np.ndarray, counts: list, displs: list | None, form: str) -> list:
    if form == "counts":
        return [buf, counts]
    if form == "displs":
        return [buf, counts, displs]
    if form == "tuple":
        return [buf, (counts, displs), buf.dtype]
    return [buf, counts, displs, buf.dtype]


def place(total: int, blocks: list, counts: list, displs: list | None) -> np.ndarray:
    """The expected receive buffer: each block at its displacement, SENTINEL elsewhere."""
    out = np.full(total, SENTINEL, dtype=np.int64)
    at = 0
    for i, b in enumerate(blocks):
        d = at if displs is None else displs[i]
        out[d:d + counts[i]] = b
        at += counts[i]
    return out


def block_of(buf: np.ndarray, i: int, counts: list, displs: list | None) -> np.ndarray:
    d = sum(counts[:i]) if displs is None else displs[i]
    return buf[d:d + counts[i]]


def run_vcase(comm, coll: str, alg, case: dict):
    """One vector collective call; returns (got, expected) arrays."""
    size, rank = comm.size, comm.rank
    k, root, form, inplace, seed = (case[x] for x in ("k", "root", "form", "inplace", "seed"))
    counts = counts_of(size, k, seed)
    displs, total = layout(counts, form)
    if coll == "gatherv":
        want = place(total, [val(seed, r, counts[r]) for r in range(size)], counts, displs)
        send = val(seed, rank, counts[rank])
        if rank != root:
            comm.Gatherv(send, None, root, algorithm=alg)
            return None, None
        recv = np.full(total, SENTINEL, dtype=np.int64)
        if inplace:
            block_of(recv, rank, counts, displs)[:] = send
            comm.Gatherv(pycomm.IN_PLACE, spec(recv, counts, displs, form), root,
                         algorithm=alg)
        else:
            comm.Gatherv(send, spec(recv, counts, displs, form), root, algorithm=alg)
        return recv, want
    if coll == "scatterv":
        whole = place(total, [val(seed, r, counts[r]) for r in range(size)], counts, displs)
        want = block_of(whole, rank, counts, displs).copy()
        if rank == root:
            send = whole.copy()
            if inplace:
                comm.Scatterv(spec(send, counts, displs, form), pycomm.IN_PLACE, root,
                              algorithm=alg)
                return send, whole          # the root's buffer is left as it was
            recv = np.full(counts[rank], SENTINEL, dtype=np.int64)
            comm.Scatterv(spec(send, counts, displs, form), recv, root, algorithm=alg)
            if not np.array_equal(send, whole):
                return send, whole
            return recv, want
        recv = np.full(counts[rank], SENTINEL, dtype=np.int64)
        comm.Scatterv(None, recv, root, algorithm=alg)
        return recv, want
    if coll == "allgatherv":
        want = place(total, [val(seed, r, counts[r]) for r in range(size)], counts, displs)
        recv = np.full(total, SENTINEL, dtype=np.int64)
        send = val(seed, rank, counts[rank])
        if inplace:
            block_of(recv, rank, counts, displs)[:] = send
            comm.Allgatherv(pycomm.IN_PLACE, spec(recv, counts, displs, form), algorithm=alg)
        else:
            comm.Allgatherv(send, spec(recv, counts, displs, form), algorithm=alg)
        return recv, want
    if coll == "alltoallv":
        # rank i sends m(i, j) elements to rank j; symmetric when IN_PLACE (MPI needs it)
        def m(i, j):
            return (((i + j) if inplace else (2 * i + j + seed)) % 3) * k

        def data(i, j):
            return val(seed, 1000 * i + j, m(i, j))

        sc = [m(rank, j) for j in range(size)]
        rc = [m(j, rank) for j in range(size)]
        sd, stotal = layout(sc, form)
        rd, rtotal = layout(rc, form)
        want = place(rtotal, [data(j, rank) for j in range(size)], rc, rd)
        if inplace:
            recv = place(rtotal, [data(rank, j) for j in range(size)], rc, rd)
            comm.Alltoallv(pycomm.IN_PLACE, spec(recv, rc, rd, form), algorithm=alg)
        else:
            send = place(stotal, [data(rank, j) for j in range(size)], sc, sd)
            recv = np.full(rtotal, SENTINEL, dtype=np.int64)
            comm.Alltoallv(spec(send, sc, sd, form), spec(recv, rc, rd, form), algorithm=alg)
        return recv, want
    raise ValueError(coll)


def ref_reduce(op, arrays: list) -> np.ndarray:
    return functools.reduce(lambda a, b: UFUNC[op](a, b), arrays).astype(arrays[0].dtype)


def run_rcase(comm, coll: str, alg, case: dict):
    """One Reduce_scatter / Scan / Exscan call; returns (got, expected)."""
    size, rank = comm.size, comm.rank
    k, inplace, seed, opname, dt = (case[x] for x in ("k", "inplace", "seed", "op", "dtype"))
    op = getattr(pycomm, opname)
    if coll == "reduce_scatter":
        counts = counts_of(size, k, seed)
        total = sum(counts)
        lo = sum(counts[:rank])
        want = ref_reduce(opname, [val(seed, r, total, dt) for r in range(size)])
        want = want[lo:lo + counts[rank]]
        if inplace:
            recv = val(seed, rank, total, dt)
            comm.Reduce_scatter(pycomm.IN_PLACE, recv, counts, op, algorithm=alg)
            return recv[:counts[rank]], want
        send = val(seed, rank, total, dt)
        recv = np.full(counts[rank], SENTINEL, dtype=dt)
        comm.Reduce_scatter(send, recv, None if case["nocounts"] else counts, op,
                            algorithm=alg)
        if not np.array_equal(send, val(seed, rank, total, dt)):
            return send, val(seed, rank, total, dt)
        return recv, want
    inputs = [val(seed, r, k, dt) for r in range(size)]
    last = rank if coll == "scan" else rank - 1
    want = ref_reduce(opname, inputs[:last + 1]) if last >= 0 else \
        np.full(k, SENTINEL, dtype=dt)
    method = comm.Scan if coll == "scan" else comm.Exscan
    if inplace:
        recv = inputs[rank].copy()
        method(pycomm.IN_PLACE, recv, op, algorithm=alg)
        if last < 0:
            want = inputs[rank]             # rank 0's Exscan: recvbuf untouched
    else:
        recv = np.full(k, SENTINEL, dtype=dt)
        method(inputs[rank].copy(), recv, op, algorithm=alg)
    return recv, want


def compare(got, want) -> str | None:
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
    ok = np.allclose(got, want, rtol=1e-12, atol=0) if got.dtype.kind == "f" else \
        np.array_equal(got, want)
    if ok:
        return None
    bad = np.flatnonzero(got != want)
    return (f"{bad.size} wrong elements, first at {bad[0]}: got {got[bad[0]]!r}, expected "
            f"{want[bad[0]]!r}")


def label(case: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in case.items() if k != "seed")


def _rank_cases(coll: str, alg, cases: list) -> list:
    comm = pycomm.COMM_WORLD
    runner = run_vcase if coll in VCOLLS else run_rcase
    out = []
    for case in cases:
        try:
            got, want = runner(comm, coll, alg, case)
        except pycomm.CommError as exc:      # report, then stop: the world may be unusable
            out.append((label(case), f"{type(exc).__name__}: {exc}"))
            break
        out.append((label(case), None if got is None else compare(got, want)))
    return out


def check(results: list) -> None:
    failures = [f"rank {r}: {lab}: {err}" for r, res in enumerate(results)
                for lab, err in res if err]
    assert not failures, f"{len(failures)} failing cases:\n" + "\n".join(failures[:25])


# -- cases ---------------------------------------------------------------------------------

def vcases(coll: str, size: int) -> list:
    roots = range(size) if coll in ("gatherv", "scatterv") else (None,)
    cases = []
    for root in roots:
        for form in FORMS:
            for inplace in (False, True):
                cases.append(dict(k=2, root=root, form=form, inplace=inplace))
    for k in (0, 1, BIG):                     # all zero, single elements, rendezvous
        cases.append(dict(k=k, root=size - 1 if roots[0] is not None else None,
                          form="displs", inplace=False))
    return [dict(c, seed=i) for i, c in enumerate(cases)]


def rcases(coll: str) -> list:
    cases = []
    for k in (0, 1, 7, BIG):
        for inplace in (False, True):
            cases.append(dict(k=k, inplace=inplace, op="SUM", dtype="int64"))
    for op, dt in (("PROD", "float64"), ("MAX", "int32"), ("MIN", "float32"),
                   ("SUM", "float64")):
        cases.append(dict(k=5, inplace=False, op=op, dtype=dt))
    if coll == "reduce_scatter":
        for c in cases:
            c["nocounts"] = False
        cases += [dict(k=k, inplace=False, op="SUM", dtype="int64", nocounts=True)
                  for k in (0, 3, BIG)]
    return [dict(c, seed=i) for i, c in enumerate(cases)]


# -- tests ---------------------------------------------------------------------------------

# The tests of one world take their results from one task per test function
# (conftest.World.run_case): the same calls and checks per (collective, algorithm).

def _vector_table(world) -> dict:
    return {(c, a): (c, a, vcases(c, world.size))
            for c, a in (p.values[0] for p in _pairs(VCOLLS))}


def _reducing_table(world) -> dict:
    return {(c, a): (c, a, rcases(c)) for c, a in (p.values[0] for p in _pairs(REDUCING))}


@pytest.mark.parametrize("pair", _pairs(VCOLLS), ids=_pair_id)
def test_vector_collectives(world_small, pair):
    check(world_small.run_case(_rank_cases, _vector_table, pair))


@pytest.mark.parametrize("pair", _pairs(REDUCING), ids=_pair_id)
def test_reduce_scatter_scan_exscan(world_small, pair):
    check(world_small.run_case(_rank_cases, _reducing_table, pair))


def _concat_digits(invec, inoutvec):
    """(v1, p1) o (v2, p2) = (v1*p2 + v2, p1*p2): appends base-16 digit strings (a digit per
    rank, up to 16 ranks); associative, not commutative (as in test_cco_buf.py)."""
    return (invec.real * inoutvec.imag + inoutvec.real) + 1j * (invec.imag * inoutvec.imag)


def _rank_noncommutative(coll: str, alg, n: int):
    comm = pycomm.COMM_WORLD
    op = pycomm.Op.Create(_concat_digits, commute=False)
    size, rank = comm.size, comm.rank
    try:
        if coll == "reduce_scatter":
            counts = [n * (r % 2 + 1) for r in range(size)]
            buf = np.full(counts[rank], -1 + 0j)
            comm.Reduce_scatter(np.full(sum(counts), rank + 16j), buf, counts, op,
                                algorithm=alg)
        else:
            buf = np.full(n, -1 + 0j)
            getattr(comm, coll.capitalize())(np.full(n, rank + 16j), buf, op, algorithm=alg)
    except pycomm.ArgumentError as exc:
        return "refused", str(exc)
    return "ran", buf.real.tolist()


def _noncommutative_table(world) -> dict:
    return {(p.values[0], n): (*p.values[0], n) for n in (1, 37) for p in _pairs(REDUCING)}


@pytest.mark.parametrize("n", [1, 37])
@pytest.mark.parametrize("pair", _pairs(REDUCING), ids=_pair_id)
def test_non_commutative_op_keeps_rank_order(world_small, pair, n):
    coll, alg = pair
    s = world_small.size

    def digits(hi):
        return float(int("".join(f"{r:x}" for r in range(hi + 1)), 16)) if hi >= 0 else -1.0

    results = world_small.run_case(_rank_noncommutative, _noncommutative_table, (pair, n))
    if alg is not None and REGISTRY[coll][alg].unfit_reason(s, False):
        assert all(kind == "refused" and "commutative" in msg for kind, msg in results)
        return
    for rank, (kind, values) in enumerate(results):
        assert kind == "ran", f"rank {rank}: {values}"
        if coll == "reduce_scatter":
            want = [digits(s - 1)] * (n * (rank % 2 + 1))
        else:
            want = [digits(rank if coll == "scan" else rank - 1)] * n
        assert values == want, f"rank {rank}: operands combined out of rank order"


# -- object scan / exscan (built on allgather: no algorithms needed) -----------------------

def _rank_object_scans():
    comm = pycomm.COMM_WORLD
    r = comm.rank
    maxop = pycomm.MAX
    pair_op = pycomm.Op.Create(lambda a, b: (a[0] * 10 + b[0], a[1] + b[1]), commute=False)
    return dict(
        sum=comm.scan(r + 1), exsum=comm.exscan(r + 1),
        text=comm.scan(str(r)), extext=comm.exscan(str(r)),
        lists=comm.scan([r]), maxv=comm.scan((r * 5) % 7, op=maxop),
        prod=comm.exscan(r + 2, op=pycomm.PROD),
        user=comm.scan((r + 1, [r]), op=pair_op),
        exuser=comm.exscan((r + 1, [r]), op=pair_op),
        array=comm.scan(np.arange(3) + r).tolist())


def test_object_scan_and_exscan(world):
    for rank, got in enumerate(world.run(_rank_object_scans)):
        upto = range(rank + 1)
        below = range(rank)
        assert got["sum"] == sum(r + 1 for r in upto)
        assert got["exsum"] == (None if rank == 0 else sum(r + 1 for r in below))
        assert got["text"] == "".join(map(str, upto))
        assert got["extext"] == (None if rank == 0 else "".join(map(str, below)))
        assert got["lists"] == list(upto)
        assert got["maxv"] == max((r * 5) % 7 for r in upto)
        assert got["prod"] == (None if rank == 0 else int(np.prod([r + 2 for r in below])))
        assert got["user"] == (int("".join(str(r + 1) for r in upto)), list(upto))
        assert got["exuser"] == (None if rank == 0 else
                                 (int("".join(str(r + 1) for r in below)), list(below)))
        assert got["array"] == (np.arange(3) * (rank + 1) + sum(upto)).tolist()


# -- argument errors (raised on every rank before any byte moves) --------------------------

def _rank_bad_vector_args():
    comm = pycomm.COMM_WORLD
    size, rank = comm.size, comm.rank
    other = (rank + 1) % size
    buf = np.zeros(4 * size, dtype=np.int64)
    calls = {
        "counts length": lambda: comm.Allgatherv(np.zeros(4, np.int64),
                                                 [buf, [4] * (size + 1)]),
        "negative count": lambda: comm.Allgatherv(np.zeros(0, np.int64),
                                                  [buf, [-1] + [0] * (size - 1)]),
        "count not int": lambda: comm.Alltoallv([buf, ["a"] * size], [buf, [1] * size]),
        "overrun": lambda: comm.Allgatherv(np.zeros(4, np.int64),
                                           [buf, [4] * size, [4 * size - 3] * size]),
        "not a spec": lambda: comm.Allgatherv(np.zeros(4, np.int64), buf),
        "sendbuf vs counts": lambda: comm.Allgatherv(np.zeros(3, np.int64),
                                                     [buf, [4] * size]),
        "dtype": lambda: comm.Alltoallv([np.zeros(size), [1] * size],
                                        [buf, [1] * size]),
        "Gatherv root": lambda: comm.Gatherv(buf[:4], [buf, [4] * size], root=size),
        # every rank names another root, so every rank is off root (size 1: bad root)
        "Scatterv IN_PLACE off root": lambda: comm.Scatterv(
            None, pycomm.IN_PLACE, root=other if size > 1 else 1),
        "Reduce_scatter IN_PLACE without counts": lambda: comm.Reduce_scatter(
            pycomm.IN_PLACE, np.zeros(3)),
        "Reduce_scatter counts": lambda: comm.Reduce_scatter(np.zeros(5), np.zeros(2),
                                                             [2] * size),
        "Scan size": lambda: comm.Scan(np.zeros(3), np.zeros(4)),
        "Exscan op": lambda: comm.Exscan(np.zeros(2, complex), np.zeros(2, complex),
                                         pycomm.MAX),
    }
    out = {}
    for what, fn in calls.items():
        try:
            fn()
            out[what] = "ran"
        except pycomm.ArgumentError:
            out[what] = "ArgumentError"
    comm.Barrier()
    return out


def test_bad_vector_arguments_raise(world_small):
    for rank, got in enumerate(world_small.run(_rank_bad_vector_args)):
        assert all(v == "ArgumentError" for v in got.values()), f"rank {rank}: {got}"


@given(size=st.integers(1, 5), n=st.integers(0, 10),
       counts=st.lists(st.integers(-1, 6), max_size=6),
       displs=st.lists(st.integers(-1, 11), max_size=6), writable=st.booleans(),
       frozen=st.booleans())
@settings(max_examples=300, deadline=None)
def test_the_short_vector_parse_agrees_with_the_general_one(size, n, counts, displs,
                                                            writable, frozen):
    """``[array, counts, displs]`` with lists takes one short pass in ``_vspec``; with
    tuples (the same values) the general parse. Both give the same array, counts and
    displacements, or both raise. The short pass keeps the last lists it accepted: the
    same lists again (on any buffer, one element shorter too, and as equal floats) still
    agree with the general parse."""
    from types import SimpleNamespace
    from pycomm.vcoll import VectorMethods
    comm = SimpleNamespace(rank=0, size=size, _vspec_memo=None)
    comm._counts = functools.partial(VectorMethods._counts, comm)

    def parse(spec):
        try:
            return VectorMethods._vspec(comm, spec, "recvbuf", writable=writable)
        except (pycomm.ArgumentError, pycomm.InvalidBufferError) as exc:
            return type(exc)
    for length, kind in ((n, int), (n, int), (max(n - 1, 0), int), (n, float)):
        buf = np.arange(float(length))
        buf.flags.writeable = not frozen
        short = parse([buf, [kind(c) for c in counts], [kind(d) for d in displs]])
        general = parse([buf, tuple(counts), tuple(displs)])
        if isinstance(general, type):
            assert short is general, (length, kind)
        else:
            assert short[0] is buf and short[1:] == general[1:], (short, general)
            assert all(type(x) is int for x in short[1] + short[2])
