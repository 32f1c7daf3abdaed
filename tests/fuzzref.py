"""Inputs and numpy references of the differential fuzzer (tests/fuzzgen.py).

Every rank's input of a step comes from a generator seeded by (seed, step, world rank,
part), so that any rank rebuilds any other rank's input (:func:`make_input`) and computes
the reference of its own result (:func:`reduce_ref`); :func:`compare` says whether a
result is right.

Exactness: integer, bool, copy and gather results must be equal. Floating-point inputs
come in two modes: "exact" (small multiples of 1/8, or powers of two for PROD: every sum
and product of up to 9 of them is representable, so any order of evaluation gives the
same bits, and the result must equal the reference exactly) and "random" (uniform; a sum
of n terms evaluated in any order is within (n-1)·eps·Σ|x_i| of the exact sum (each of
the n-1 additions rounds by at most eps/2 of a partial sum bounded by Σ|x_i|; the
tolerance takes n·eps·Σ|x_i|, eps of the dtype), a product of n factors within about
2n·eps relative).
"""

from __future__ import annotations

import numpy as np

import pycomm

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


# -- user ops (made on the ranks) ----------------------------------------------------------

def affine(invec, inoutvec):
    """(a1, b1) ∘ (a2, b2) = x -> a2 (a1 x + b1) + b2: associative, not commutative."""
    a = invec["a"] * inoutvec["a"]
    b = inoutvec["a"] * invec["b"] + inoutvec["b"]
    inoutvec["a"] = a
    inoutvec["b"] = b


def user_sum(invec, inoutvec):
    """SUM as a commutative user op (the user-op path on plain dtypes)."""
    np.add(invec, inoutvec, out=inoutvec)


def affine_ref(x, y):
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
            acc = affine_ref(acc, x)
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


def np_dtype(dtype):
    """The numpy dtype of a case's dtype name ("affine", "pair:<value dtype>" or numpy's)."""
    if dtype == "affine":
        return AFFINE
    if dtype.startswith("pair:"):
        return pycomm.ops.pair_dtype(dtype[5:])
    return np.dtype(dtype)
