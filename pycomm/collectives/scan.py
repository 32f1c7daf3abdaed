"""Scan and exscan: rank ``r`` gets the prefix ``x_0 ∘ ... ∘ x_r`` (exscan: ``... ∘ x_{r-1}``).

Notation: ``p`` ranks, ``n`` bytes per vector, ``α`` latency per message, ``β`` seconds per
byte, ``γ`` seconds per byte reduced, ``L = ceil(log2 p)``.

**recursive_doubling** (Thakur et al. 2005 / MPICH ``scan_intra_recursive_doubling`` and
``exscan_intra_recursive_doubling``; the parallel-prefix scheme of Hillis & Steele 1986 on
a hypercube). Each rank keeps ``partial``, the reduction over its aligned group of ``2^k``
ranks (clipped at ``p``). In step ``k`` it swaps ``partial`` with ``r XOR 2^k`` (skipped
when that rank does not exist); the partner's group is entirely below or above, so
``partial`` grows as ``theirs ∘ partial`` or ``partial ∘ theirs`` (rank order kept: any
associative op), and when the partner's group is below, its partial also enters the
result on the left. Exscan does the same without the own contribution in the result, and
leaves rank 0's ``recvbuf`` untouched (MPI leaves it undefined). ``L`` messages of ``n``
bytes per rank: time ``L(α + nβ + 2nγ)``; scratch ``2n``. ``sendbuf`` is not modified.
"""

from __future__ import annotations

import numpy as np

__all__ = ["scan_recursive_doubling", "exscan_recursive_doubling"]


def _prefix(cc, sendbuf: np.ndarray, recvbuf: np.ndarray, op, inclusive: bool) -> None:
    size, rank = cc.size, cc.rank
    partial = sendbuf.copy()
    incoming = np.empty_like(sendbuf)
    have_result = inclusive
    if inclusive:
        recvbuf[:] = sendbuf
    mask = 1
    while mask < size:
        partner = rank ^ mask
        if partner < size:
            cc.sendrecv(partial, partner, incoming, partner)
            if partner < rank:
                op.apply(incoming, partial)
                if have_result:
                    op.apply(incoming, recvbuf)
                else:
                    recvbuf[:] = incoming
                    have_result = True
            else:
                op.apply_left(partial, incoming)  # incoming is scratch from here on
        mask <<= 1


def scan_recursive_doubling(cc, sendbuf: np.ndarray, recvbuf: np.ndarray, op) -> None:
    """Inclusive prefix reduction: ``recvbuf`` on rank ``r`` = ``x_0 ∘ ... ∘ x_r``.

    Args:
        cc: the collective context.
        sendbuf: 1-D C-contiguous array, this rank's ``x_r``; not modified.
        recvbuf: 1-D C-contiguous array of the same size and dtype, not overlapping
            ``sendbuf`` (for ``IN_PLACE`` pass a copy as ``sendbuf``).
        op: any associative :class:`pycomm.ops.Op` (rank order is kept).
    """
    _prefix(cc, sendbuf, recvbuf, op, inclusive=True)


def exscan_recursive_doubling(cc, sendbuf: np.ndarray, recvbuf: np.ndarray, op) -> None:
    """Exclusive prefix reduction: ``recvbuf`` on rank ``r > 0`` = ``x_0 ∘ ... ∘ x_{r-1}``.

    Args:
        cc: the collective context.
        sendbuf: 1-D C-contiguous array, this rank's ``x_r``; not modified.
        recvbuf: 1-D C-contiguous array of the same size and dtype, not overlapping
            ``sendbuf``; left untouched on rank 0.
        op: any associative :class:`pycomm.ops.Op` (rank order is kept).
    """
    _prefix(cc, sendbuf, recvbuf, op, inclusive=False)
