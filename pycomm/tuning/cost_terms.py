"""Terms shared by the cost model's closed forms (:mod:`pycomm.tuning.cost`) and its
step models (:mod:`pycomm.tuning.cost_steps`): the transport's :class:`Constants`,
segment counts and scratch sizes of the pipelined schedules (read from the same variables
the schedules read), tree depths, and the protocol that prices a message of a given size.
The bottom of the cost model: it imports neither of the other two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pycomm import config
from pycomm.collectives.topology import ceil_log2, pof2_floor


@dataclass(frozen=True)
class Constants:
    """Cost-model constants of one transport (seconds, seconds per byte).

    ``alpha`` and ``beta`` price a message sent eagerly (up to ``eager`` bytes);
    ``alpha_rndv`` and ``beta_rndv`` one sent by the rendezvous protocol (RTS, a one-sided
    or in-place copy, FIN), whose handshake costs more than one eager message and whose
    single copy runs at another rate. None: the eager figures serve both.
    """

    alpha: float   # s per eager message (latency, incl. Python overhead per p2p call)
    beta: float    # s per byte moved between two ranks (eager; memory copies)
    gamma: float   # s per byte combined by a reduction op
    sigma: float   # s per byte of newly allocated scratch (first-touch page faults)
    wake: float = 0.0  # extra s per message when ranks outnumber cores (a waiter's turn)
    alpha_rndv: float | None = None  # s per rendezvous message (handshake included)
    beta_rndv: float | None = None   # s per byte of a rendezvous message
    eager: float = math.inf  # bytes: larger messages go by rendezvous (PYCOMM_EAGER_LIMIT)
    # ((bytes, lanes), ...) ascending: copies of that size the memory system runs at full
    # speed at once (pycomm.tuning.tune.measure_lanes); empty: as many as there are cores
    lanes: tuple[tuple[float, float], ...] = ()
    # s per exchange step (each rank sends and receives a small message at once); None:
    # the ping-pong's alpha (tables from before it was measured)
    alpha_x: float | None = None
    # ((ranks per core, s), ...) ascending: what an exchange step pays per turn of the
    # cores when ranks outnumber them (pycomm.tuning.tune.measure_exchange_wake); empty: ``wake``
    wake_x: tuple[tuple[float, float], ...] = ()
    mem: float = math.inf  # lanes at the working set of the call being priced (cost())
    turns: float = 1.0  # turns of the cores a step of the call being priced needs (cost())

    @property
    def xtra(self) -> float:
        """Seconds an exchange step costs over a one-way message (``alpha_x - alpha``)."""
        return 0.0 if self.alpha_x is None else max(0.0, self.alpha_x - self.alpha)

    def exchange_wake(self, oversubscription: float) -> float:
        """Seconds an exchange step pays per turn of the cores at ``oversubscription``
        ranks per core: linear between the measured points, the end values beyond them;
        ``wake`` when none were measured."""
        return _interpolate(self.wake_x, oversubscription, self.wake, log=False)

    def streams(self, nbytes: float) -> float:
        """Concurrent copies of ``nbytes`` each that run at full speed (interpolated in
        log size between the measured sizes, the end values beyond them; inf: unknown)."""
        return _interpolate(self.lanes, nbytes, math.inf, log=True)


def _interpolate(pts: tuple[tuple[float, float], ...], x: float, empty: float, *,
                 log: bool) -> float:
    """``pts`` ((x, y), ...) ascending, read at ``x``: linear in ``x`` (``log``: in
    ``log x``) between points, the end values beyond them, ``empty`` when there are none."""
    if not pts:
        return empty
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            t = math.log(x / x0) / math.log(x1 / x0) if log else (x - x0) / (x1 - x0)
            return y0 + t * (y1 - y0)
    return pts[-1][1]


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


def _folds(p: int) -> bool:
    return pof2_floor(p) != p


def _protocol(k: Constants, nbytes: float) -> tuple[float, float]:
    """``(α, β)`` of one message of ``nbytes``: eager up to ``k.eager``, else rendezvous."""
    if nbytes > k.eager:
        return k.alpha_rndv, k.beta_rndv
    return k.alpha, k.beta
