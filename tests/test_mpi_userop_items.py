"""pycomm.MPI: a user op on a derived datatype of several basic elements gets whole items.

MPI calls a user op on whole items of the call's datatype. The Communicator's schedules
split a buffer between ranks and into segments, and pycomm.MPI views a derived datatype's
items as opaque items so that those splits fall between items (``pycomm.MPI.collspec.item_array``,
``pycomm.MPI.ops.whole_items``). Each test runs one collective on one datatype, with a
commutative and a non-commutative user op whose result depends on which elements form
an item (a complex product, a lexicographic maximum, affine maps, 2x2 matrix products),
at counts 0, 1, 7, one just past the eager limit (64 KiB: rendezvous, tree segments,
blocks split between ranks) and, for the reductions that segment a large buffer, one past
1 MiB (the ring's and the halving's segments); the ``tiny`` worlds (24-byte segments)
split every call into one-item segments. Every rank
rebuilds every rank's input from seeds and checks its result against a numpy reference
(exact: integers, or small integers in float64), and that the holes of a datatype with
gaps stay untouched in the receive buffer.

A struct of mixed basic types (int32, float64) travels as bytes and cannot be reduced
(``MPI.ERR_TYPE``), user op or not: tested as such.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

from conftest import World

cloudpickle.register_pickle_by_value(sys.modules[__name__])

EAGER_LIMIT = 65536
SEGMENT = 1 << 20                   # the ring's and the halving's default segment bytes
SENTINEL = -7                       # holes of the buffers, and the untouched receive items


@pytest.fixture(scope="session", params=[(1, "shm"), (2, "shm"), (3, "shm"), (4, "shm"),
                                         (5, "shm"), (3, "tcp"), (3, "shm", "tiny"),
                                         (4, "tcp", "tiny")],
                ids=lambda p: "-".join([f"n{p[0]}", *p[1:]]))
def world(request) -> World:
    """Sizes 1 to 5 (powers of two and not), an odd size on tcp, and the tiny segments."""
    return World(*request.param)


# -- the user ops (inoutvec = invec ∘ inoutvec, invec from the lower ranks) ----------------

def cmul(invec, inoutvec, datatype):
    """Complex product of (re, im) pairs: commutative."""
    a, b = invec.reshape(-1, 2), inoutvec.reshape(-1, 2)
    re = a[:, 0] * b[:, 0] - a[:, 1] * b[:, 1]
    im = a[:, 0] * b[:, 1] + a[:, 1] * b[:, 0]
    b[:, 0], b[:, 1] = re, im


def affine(invec, inoutvec, datatype):
    """(a1, b1) ∘ (a2, b2) = x -> a2 (a1 x + b1) + b2: not commutative."""
    x, y = invec.reshape(-1, 2), inoutvec.reshape(-1, 2)
    a = x[:, 0] * y[:, 0]
    b = y[:, 0] * x[:, 1] + y[:, 1]
    y[:, 0], y[:, 1] = a, b


def _lexmax(per: int):
    """The lexicographically larger of two items of ``per`` elements, in the two-argument
    form: commutative."""
    def lexmax(invec, inoutvec):
        x, y = invec.reshape(-1, per), inoutvec.reshape(-1, per)
        take = np.zeros(len(x), bool)
        undecided = np.ones(len(x), bool)
        for j in range(per):
            take |= undecided & (x[:, j] > y[:, j])
            undecided &= x[:, j] == y[:, j]
        y[take] = x[take]
    return lexmax


def triu(invec, inoutvec, datatype):
    """Product of upper triangular 2x2 matrices (a, b, c) = [[a, b], [0, c]], ``in @ inout``:
    not commutative."""
    x, y = invec.reshape(-1, 3), inoutvec.reshape(-1, 3)
    a = x[:, 0] * y[:, 0]
    b = x[:, 0] * y[:, 1] + x[:, 1] * y[:, 2]
    c = x[:, 2] * y[:, 2]
    y[:, 0], y[:, 1], y[:, 2] = a, b, c


def matmul(invec, inoutvec, datatype):
    """2x2 matrix product ``in @ inout`` (int64, wrapping): not commutative."""
    x, y = invec.reshape(-1, 2, 2), inoutvec.reshape(-1, 2, 2)
    y[...] = np.matmul(x, y)


# -- the datatypes ---------------------------------------------------------------------

def _datatype(name: str):
    from pycomm import MPI
    if name == "pair_f64":
        return MPI.DOUBLE.Create_contiguous(2).Commit()
    if name == "triple_i32":
        return MPI.INT32_T.Create_contiguous(3).Commit()
    if name == "vector_i64":            # 2 runs of 2, stride 3: [x x _ x x], 4 elements
        return MPI.INT64_T.Create_vector(2, 2, 3).Commit()
    if name == "struct_f64":            # 2 doubles at 0, 1 at byte 24: [x x _ x]
        return MPI.Datatype.Create_struct([2, 1], [0, 24], [MPI.DOUBLE, MPI.DOUBLE]).Commit()
    raise ValueError(name)


TYPES = {   # name: (basic dtype, extent in elements, element offsets of an item's values)
    "pair_f64": ("float64", 2, (0, 1)),
    "triple_i32": ("int32", 3, (0, 1, 2)),
    "vector_i64": ("int64", 5, (0, 1, 3, 4)),
    "struct_f64": ("float64", 4, (0, 1, 3)),
}
# the ops of each datatype: (name, commutative); "lexmax" is the two-argument form
OPS = {
    "pair_f64": (("cmul", True), ("affine", False)),
    "triple_i32": (("lexmax", True), ("triu", False)),
    "vector_i64": (("lexmax", True), ("matmul", False)),
    "struct_f64": (("lexmax", True), ("triu", False)),
}
COLLS = ("Allreduce", "Iallreduce", "Reduce", "Reduce_scatter_block", "Reduce_scatter",
         "Scan", "Exscan")
SEGMENTED = ("Allreduce", "Reduce", "Reduce_scatter_block", "Reduce_scatter")


def counts(tname: str, tiny: bool, coll: str = "Allreduce", size: int = 1) -> list[int]:
    """0, 1, 7, then (not on the tiny worlds, whose segments are one item) just past the
    eager limit and, for the collectives whose schedules segment a large buffer, past the
    ring's and halving's segment; for the calls with one block per rank, the block that
    makes the whole buffer that large."""
    if tiny:
        return [0, 1, 7, 33]
    nbytes = np.dtype(TYPES[tname][0]).itemsize * len(TYPES[tname][2])
    big = [EAGER_LIMIT // nbytes + 3]
    if coll in SEGMENTED:
        big.append(SEGMENT // nbytes + 5)
    if coll.startswith("Reduce_scatter"):
        big = [m // size + 1 for m in big]
    return [0, 1, 7] + big


def items(tname: str, opname: str, rank: int, m: int) -> np.ndarray:
    """Rank ``rank``'s ``m`` items as an (m, per) array, drawn so the reference is exact."""
    basic, _, offs = TYPES[tname]
    rng = np.random.default_rng([len(tname), len(opname), rank, m])
    per = len(offs)
    if opname == "lexmax":          # few values: ties on the first elements are common
        return rng.integers(0, 3, (m, per)).astype(basic)
    if basic == "float64":          # small integers: every product and sum is exact
        v = rng.integers(-2, 3, (m, per)).astype(basic)
        if opname in ("affine", "triu"):
            v[:, 0] = rng.choice([-2.0, -1.0, 1.0, 2.0], m)
        return v
    info = np.iinfo(basic)          # integers wrap: exact modulo 2**bits
    return rng.integers(info.min, info.max, (m, per), dtype=basic, endpoint=True)


def reference(opname: str, parts: list) -> np.ndarray:
    """``parts[0] ∘ parts[1] ∘ ...`` of (m, per) arrays, computed without the op."""
    if opname == "cmul":
        z = np.prod([p[:, 0] + 1j * p[:, 1] for p in parts], axis=0)
        return np.stack([z.real, z.imag], 1)
    if opname == "lexmax":
        per = parts[0].shape[1]
        key = [sum(p[:, j].astype(np.int64) * 3 ** (per - 1 - j) for j in range(per))
               for p in parts]
        best = np.argmax(np.stack(key), axis=0)
        return np.stack(parts)[best, np.arange(len(best))]
    if opname == "affine":
        acc = parts[0].copy()
        for p in parts[1:]:
            acc = np.stack([acc[:, 0] * p[:, 0], p[:, 0] * acc[:, 1] + p[:, 1]], 1)
        return acc
    if opname == "triu":
        def full(p):
            z = np.zeros((len(p), 2, 2), p.dtype)
            z[:, 0, 0], z[:, 0, 1], z[:, 1, 1] = p[:, 0], p[:, 1], p[:, 2]
            return z
        acc = full(parts[0])
        for p in parts[1:]:
            acc = np.matmul(acc, full(p))
        return np.stack([acc[:, 0, 0], acc[:, 0, 1], acc[:, 1, 1]], 1)
    if opname == "matmul":
        acc = parts[0].reshape(-1, 2, 2)
        for p in parts[1:]:
            acc = np.matmul(acc, p.reshape(-1, 2, 2))
        return acc.reshape(-1, 4)
    raise ValueError(opname)


def spread(tname: str, its: np.ndarray) -> np.ndarray:
    """The buffer of the items ``its`` laid out by the datatype, holes = SENTINEL."""
    basic, extent, offs = TYPES[tname]
    buf = np.full(len(its) * extent, SENTINEL, basic)
    for j, o in enumerate(offs):
        buf[o::extent] = its[:, j]
    return buf


def gather(tname: str, buf: np.ndarray) -> tuple[np.ndarray, bool]:
    """(the items of ``buf``, whether every hole still holds SENTINEL)."""
    _, extent, offs = TYPES[tname]
    grid = buf.reshape(-1, extent)
    holes = [k for k in range(extent) if k not in offs]
    return grid[:, list(offs)], bool(np.all(grid[:, holes] == SENTINEL))


# -- on the ranks ------------------------------------------------------------------------

def _rank_case(coll: str, tname: str, tiny: bool) -> list:
    """Every op and count of one (collective, datatype); the failures, as text."""
    from pycomm import MPI
    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    dt = _datatype(tname)
    fns = {"cmul": cmul, "affine": affine, "triu": triu, "matmul": matmul,
           "lexmax": _lexmax(len(TYPES[tname][2]))}
    failures = []
    try:
        for opname, commute in OPS[tname]:
            op = MPI.Op.Create(fns[opname], commute=commute)
            try:
                for m in counts(tname, tiny, coll, n):
                    got = _one(comm, coll, tname, opname, op, dt, m)
                    if got is not None:
                        failures.append(f"rank {r}/{n} {opname} count={m}: {got}")
            finally:
                op.Free()
    finally:
        dt.Free()
    return failures


def _one(comm, coll: str, tname: str, opname: str, op, dt, m: int) -> str | None:
    """Run ``coll`` on ``m`` items (per rank block where the call has blocks); None when
    the result is the reference, else what is wrong."""
    n, r = comm.size, comm.rank
    per = len(TYPES[tname][2])
    blocks = {"Reduce_scatter_block": [m] * n,
              "Reduce_scatter": [m + (q % 3) for q in range(n)]}.get(coll)
    total = sum(blocks) if blocks else m
    inputs = [items(tname, opname, q, total) for q in range(n)]
    mine = blocks[r] if blocks else m
    lo = sum(blocks[:r]) if blocks else 0
    send = spread(tname, inputs[r])
    recv = spread(tname, np.full((mine, per), SENTINEL, TYPES[tname][0]))
    if coll in ("Allreduce", "Iallreduce", "Scan", "Exscan"):
        if coll == "Iallreduce":
            comm.Iallreduce([send, m, dt], [recv, m, dt], op).Wait()
        else:
            getattr(comm, coll)([send, m, dt], [recv, m, dt], op)
        upto = {"Scan": r + 1, "Exscan": r}.get(coll, n)
        want = reference(opname, inputs[:upto]) if upto else \
            np.full((m, per), SENTINEL, TYPES[tname][0])
    elif coll == "Reduce":
        root = n - 1
        comm.Reduce([send, m, dt], [recv, m, dt] if r == root else None, op, root)
        want = reference(opname, inputs) if r == root else \
            np.full((m, per), SENTINEL, TYPES[tname][0])
    elif coll == "Reduce_scatter_block":
        comm.Reduce_scatter_block([send, total, dt], [recv, mine, dt], op)
        want = reference(opname, inputs)[lo:lo + mine]
    else:
        comm.Reduce_scatter([send, total, dt], [recv, mine, dt], blocks, op)
        want = reference(opname, inputs)[lo:lo + mine]
    got, holes = gather(tname, recv)
    if not holes:
        return "a hole of the receive buffer was written"
    if got.shape != want.shape or not np.array_equal(got, want):
        bad = np.flatnonzero(np.any(got != want, axis=1)) if got.shape == want.shape else []
        return (f"{len(bad)} of {len(want)} items differ, first at {bad[:3]}: got "
                f"{got[bad[:1]]}, want {want[bad[:1]]}")
    return None


def _rank_mixed_struct() -> list:
    """A user op on a struct of (int32, float64): the error class of each reduction."""
    from pycomm import MPI
    comm = MPI.COMM_WORLD
    dt = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.INT32_T, MPI.DOUBLE]).Commit()
    op = MPI.Op.Create(lambda a, b, t: None, commute=True)
    out = []
    try:
        buf, res = np.zeros(32, np.uint8), np.zeros(32, np.uint8)
        for call in (lambda: comm.Allreduce([buf, 2, dt], [res, 2, dt], op),
                     lambda: comm.Reduce([buf, 2, dt], [res, 2, dt], op, 0),
                     lambda: comm.Scan([buf, 2, dt], [res, 2, dt], op)):
            try:
                call()
                out.append(None)
            except MPI.Exception as exc:
                out.append(exc.Get_error_class() == MPI.ERR_TYPE)
    finally:
        op.Free()
        dt.Free()
    return out


# -- the tests ---------------------------------------------------------------------------

def _table(world) -> dict:
    tiny = world.variant == "tiny"
    return {(c, t): (c, t, tiny) for c in COLLS for t in TYPES}


@pytest.mark.parametrize("tname", list(TYPES))
@pytest.mark.parametrize("coll", COLLS)
def test_user_op_gets_whole_items(world, coll, tname):
    for failures in world.run_case(_rank_case, _table, (coll, tname)):
        assert failures == [], "\n".join(failures[:10])


def test_user_op_on_a_mixed_struct_is_refused(world):
    for per_rank in world.run(_rank_mixed_struct):
        assert per_rank == [True, True, True], per_rank


def test_reference_folds_in_rank_order():
    """The references themselves: the ops on whole arrays, folded left to right."""
    fns = {"cmul": cmul, "affine": affine, "triu": triu, "matmul": matmul}
    for tname, ops in OPS.items():
        for opname, _ in ops:
            fn = fns.get(opname) or _lexmax(len(TYPES[tname][2]))
            parts = [items(tname, opname, q, 9) for q in range(4)]
            acc = parts[0].copy()
            for p in parts[1:]:
                right = p.copy()
                args = (acc.reshape(-1), right.reshape(-1))
                fn(*args) if opname == "lexmax" else fn(*args, None)
                acc = right
            assert np.array_equal(acc, reference(opname, parts)), (tname, opname)
