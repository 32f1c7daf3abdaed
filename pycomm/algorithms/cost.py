"""The α-β-γ cost model the automatic algorithm choice minimises.

Modelled time of one call = ``α`` per message on the critical path + ``β`` per byte moved
+ ``γ`` per byte reduced + ``σ`` per byte of freshly allocated scratch (the formulas are
those of Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication
operations in MPICH", plus the σ term). Each function takes ``n``, the bytes of the call
as defined in :func:`pycomm.algorithms.choose`, and ``p``, the number of ranks, and
returns seconds. Only the ranking matters: constants shift the crossovers, not the
shapes.

Why σ: numpy scratch buffers come from fresh pages whose first touch page-faults;
``np.empty`` + copy versus copy into an existing buffer measured 0.1-0.2 ns/B extra for
1-16 MiB on the 2-core development machine. It is what separates Rabenseifner (scratch
``n/2``) from the ring (scratch ``n/p``) at large ``n``, where α-β-γ alone calls them even.

Tuning: replace :data:`CONSTANTS` with values fitted from ``benchmarks/`` runs (α from the
0-byte latency, β from the large-message p2p bandwidth, γ from ``np.add`` throughput) and
cite the run here.
"""

from __future__ import annotations

from pycomm.algorithms.topology import ceil_log2, pof2_floor

__all__ = ["CONSTANTS", "FORMULAS", "cost"]

# First estimates for shared memory on a 2-core machine, not yet fitted to a benchmark:
# α and β are the design brief's guesses for the shm transport; γ is the brief's
# 1/4e9 s/B (np.add in place measured 0.05-0.17 ns/B here, so γ is conservative); σ as
# measured above.
CONSTANTS = {
    "alpha": 8e-6,      # s per message (latency, incl. Python overhead per p2p call)
    "beta": 1 / 6e9,    # s per byte moved between two ranks
    "gamma": 1 / 4e9,   # s per byte combined by a reduction op
    "sigma": 1 / 5e9,   # s per byte of newly allocated scratch (first-touch page faults)
}


def _a() -> float:
    return CONSTANTS["alpha"]


def _b() -> float:
    return CONSTANTS["beta"]


def _g() -> float:
    return CONSTANTS["gamma"]


def _s() -> float:
    return CONSTANTS["sigma"]


def _lg(p: int) -> int:
    """ceil(log2 p): rounds of a binomial tree."""
    return ceil_log2(p)


def _lq(p: int) -> int:
    """log2 of the power-of-two group left after the fold."""
    return pof2_floor(p).bit_length() - 1


def _frac(p: int) -> float:
    return (p - 1) / p


def _qfrac(p: int) -> float:
    q = pof2_floor(p)
    return (q - 1) / q


def _fold(n: float, p: int) -> float:
    """Fold in and out for a non-power-of-two p (Thakur et al. 2005, 4.3); else 0."""
    return 0.0 if pof2_floor(p) == p else 2 * _a() + 2 * n * _b() + n * _g()


# (collective, algorithm) -> f(n bytes, p ranks) -> seconds, for p >= 2.
FORMULAS = {
    ("barrier", "dissemination"): lambda n, p: _lg(p) * _a(),
    ("bcast", "binomial"): lambda n, p: _lg(p) * (_a() + n * _b()),
    ("bcast", "scatter_allgather"):
        lambda n, p: (_lg(p) + p - 1) * _a() + 2 * n * _frac(p) * _b(),
    ("reduce", "binomial"): lambda n, p: _lg(p) * (_a() + n * _b() + n * _g()) + n * _s(),
    ("allreduce", "ring"):
        lambda n, p: (2 * (p - 1) * _a() + 2 * n * _frac(p) * _b() + n * _frac(p) * _g()
                      + n / p * _s()),
    ("allreduce", "rabenseifner"):
        lambda n, p: (2 * _lq(p) * _a() + 2 * n * _qfrac(p) * _b() + n * _qfrac(p) * _g()
                      + (n / 2 if pof2_floor(p) == p else n) * _s() + _fold(n, p)),
    ("allreduce", "recursive_doubling"):
        lambda n, p: _lq(p) * (_a() + n * _b() + n * _g()) + n * _s() + _fold(n, p),
    ("allgather", "ring"): lambda n, p: (p - 1) * _a() + n * _frac(p) * _b(),
    ("allgather", "recursive_doubling"): lambda n, p: _lg(p) * _a() + n * _frac(p) * _b(),
    ("gather", "linear"): lambda n, p: (p - 1) * _a() + n * _frac(p) * _b(),
    ("gather", "binomial"): lambda n, p: _lg(p) * _a() + n * _frac(p) * _b() + n * _s(),
    ("scatter", "linear"): lambda n, p: (p - 1) * _a() + n * _frac(p) * _b(),
    ("scatter", "binomial"): lambda n, p: _lg(p) * _a() + n * _frac(p) * _b() + n * _s(),
    ("alltoall", "pairwise"): lambda n, p: (p - 1) * _a() + n * _frac(p) * _b(),
    ("reduce_scatter_block", "ring"):
        lambda n, p: (p - 1) * _a() + n * _frac(p) * (_b() + _g()) + n / p * _s(),
    ("reduce_scatter_block", "pairwise"):
        lambda n, p: (p - 1) * _a() + n * _frac(p) * (_b() + _g()) + 2 * n / p * _s(),
}


def cost(collective: str, algorithm: str, nbytes: int, size: int) -> float:
    """Return the modelled seconds of one call.

    Args:
        collective: e.g. ``"allreduce"``.
        algorithm: e.g. ``"ring"``.
        nbytes: bytes of the call (see :func:`pycomm.algorithms.choose`), ``>= 0``.
        size: number of ranks, ``>= 1``.

    Raises:
        KeyError: the model has no formula for the pair.
    """
    formula = FORMULAS[(collective, algorithm)]
    return 0.0 if size <= 1 else formula(float(nbytes), size)
