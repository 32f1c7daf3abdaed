"""Terms shared by the cost model's closed forms (:mod:`pycomm.algorithms.cost`) and its
step models (:mod:`pycomm.algorithms.cost_steps`): segment counts and scratch sizes of the
pipelined schedules (read from the same variables the schedules read), tree depths, and
the protocol that prices a message of a given size.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pycomm import config
from pycomm.algorithms.topology import ceil_log2, pof2_floor

if TYPE_CHECKING:
    from pycomm.algorithms.cost import Constants


# Segment of the double binary tree when PYCOMM_SEGMENT_BYTES is 0 (automatic).
TREE_SEGMENT_BYTES = 65536

# Smallest segment the pipeline's automatic segment size considers (bytes); candidates are
# the powers of two from here up to the first that holds the whole vector.
MIN_PIPELINE_SEGMENT = 4096


def forced_segment() -> int:
    """``PYCOMM_SEGMENT_BYTES``, or 0 when the segment is left to the model (the default)."""
    return max(0, int(config.get("PYCOMM_SEGMENT_BYTES")))


def _segment() -> float:
    """Bytes per segment of the double binary tree."""
    return float(forced_segment() or TREE_SEGMENT_BYTES)


def pipeline_candidates(n: float) -> list[int]:
    """Segment sizes (bytes) a pipelined chain of ``n`` bytes may use: the forced one, or
    the powers of two from :data:`MIN_PIPELINE_SEGMENT` to the first that holds ``n``."""
    forced = forced_segment()
    if forced:
        return [forced]
    out, s = [MIN_PIPELINE_SEGMENT], MIN_PIPELINE_SEGMENT
    while s < n:
        s *= 2
        out.append(s)
    return out


def _ring_segs(n: float, p: int) -> float:
    """Messages per chunk of the segmented ring all-reduce (``PYCOMM_RING_SEGMENT_BYTES``)."""
    return max(1.0, math.ceil(n / p / max(1, config.get("PYCOMM_RING_SEGMENT_BYTES"))))


def _ring_scratch(n: float, p: int) -> float:
    """Scratch bytes of the segmented ring all-reduce: two segments of a chunk."""
    return 2.0 * min(n / p, max(1, config.get("PYCOMM_RING_SEGMENT_BYTES")))


def _hsegs(b: float) -> float:
    """Messages of a segmented halving or fold exchange of ``b`` bytes
    (``PYCOMM_HALVING_SEGMENT_BYTES``)."""
    return max(1.0, math.ceil(b / max(1, config.get("PYCOMM_HALVING_SEGMENT_BYTES"))))


def _pipe_scratch(b: float) -> float:
    """Scratch bytes of the segmented halving exchanges receiving at most ``b`` bytes."""
    return 2.0 * min(b, max(1, config.get("PYCOMM_HALVING_SEGMENT_BYTES")))


def _halving_scratch(n: float, p: int) -> float:
    """Scratch of the halving schedules: the fold receives ``n``, the first halving ``n/2``."""
    return _pipe_scratch(n if _folds(p) else n / 2)


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


def _folds(p: int) -> bool:
    return pof2_floor(p) != p


def _protocol(k: Constants, nbytes: float) -> tuple[float, float]:
    """``(α, β)`` of one message of ``nbytes``: eager up to ``k.eager``, else rendezvous."""
    if nbytes > k.eager:
        return k.alpha_rndv, k.beta_rndv
    return k.alpha, k.beta
