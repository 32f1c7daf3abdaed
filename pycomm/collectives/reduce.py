"""Reduce: ``root`` ends with ``x_0 ∘ x_1 ∘ ... ∘ x_{p-1}``.

Notation: ``p`` ranks, ``n`` bytes, ``α`` latency per message, ``β`` seconds per byte,
``γ`` seconds per byte reduced, ``L = ceil(log2 p)``.

**binomial** (MPICH ``reduce_intra_binomial``; Thakur et al. 2005, section 4). The mirror
image of the binomial broadcast: each rank receives its children's partials in order of
increasing distance (vrank ``v+1``, ``v+2``, ``v+4``, ...) and folds each in as
``op(own partial, child's partial)``; the partial of vrank ``v`` then covers the contiguous
vranks ``[v, v + lowbit(v))`` in order, and goes to the parent. ``L`` rounds, ``n`` bytes
per edge. Time ``L(α + nβ + nγ)``; scratch ``n`` on ranks with children.

Operand order guaranteed: for a **commutative** op the tree is rooted at ``root`` and the
result is ``x_root ∘ x_{root+1} ∘ ... ∘ x_{p-1} ∘ x_0 ∘ ... ∘ x_{root-1}`` (rotation is
harmless for commutative ops, only rounding may differ between roots). For a
**non-commutative** op the tree is rooted at rank 0, so operands combine in exact rank
order ``x_0 ∘ ... ∘ x_{p-1}``, and rank 0 then sends the result to ``root`` when
``root != 0`` (one extra ``α + nβ``), as MPICH does.

**rabenseifner** (Rabenseifner 2004, "Optimization of collective reduction operations";
Thakur et al. 2005, section 4.2; MPICH ``reduce_intra_reduce_scatter_gather``). Fold to
``q = pof2_floor(p)`` ranks and reduce-scatter by recursive halving
(:mod:`pycomm.collectives.halving`; distance 1 first, rank order kept), then gather the
reduced chunks to the root by retracing the halving backwards: at each distance, of the
two partners the one whose bit agrees with the root's new rank receives the other's
range, so the ranges double along a binomial tree towards the root. When the root sat
out of the fold its odd partner gathers and forwards the vector. Time
``2 log2(q) α + n(q-1)/q (2β + γ)`` plus the fold ``α + nβ + nγ`` (and ``α + nβ`` when
the root sat out), the fold and halving exchanges segmented as in the all-reduce; scratch
two segments (``PYCOMM_HALVING_SEGMENT_BYTES``). Beats binomial once ``n`` is large.
Serves non-commutative ops (operands combine in rank order); the result is
``x_0 ∘ ... ∘ x_{p-1}`` for every root.
"""

from __future__ import annotations

import numpy as np

from pycomm.collectives.halving import Pipe, fold_in, halve
from pycomm.collectives.scratch import give, take
from pycomm.topology import (binomial_children, binomial_parent, chunk_offsets,
                                        fold_new_rank, pof2_floor)

__all__ = ["reduce_binomial", "reduce_rabenseifner"]


def reduce_binomial(cc, buf: np.ndarray, root: int, op) -> None:
    """Binomial-tree reduce.

    Args:
        cc: the collective context.
        buf: 1-D C-contiguous array holding this rank's contribution. It is used as
            scratch on every rank (overwritten with a partial result); on ``root`` it ends
            with the result.
        root: the rank that receives the result.
        op: any associative :class:`pycomm.ops.Op`.
    """
    size, rank = cc.size, cc.rank
    if size == 1:
        return
    tree_root = root if op.commutative else 0
    children = binomial_children(rank, size, tree_root)
    if children:
        incoming = take(buf.size, buf.dtype)
        for child in children:
            cc.recv(incoming, child)
            op.apply_left(buf, incoming)  # own partial covers the lower vranks
        give(incoming)
    parent = binomial_parent(rank, size, tree_root)
    if parent is not None:
        cc.send(buf, parent)
    if tree_root != root:
        if rank == tree_root:
            cc.send(buf, root)
        elif rank == root:
            cc.recv(buf, tree_root)


def reduce_rabenseifner(cc, buf: np.ndarray, root: int, op) -> None:
    """Recursive-halving reduce-scatter + binomial gather to ``root``.

    Args:
        cc: the collective context.
        buf: 1-D C-contiguous array holding this rank's contribution; used as scratch on
            every rank, on ``root`` it ends with the result.
        root: the rank that receives the result.
        op: any associative :class:`pycomm.ops.Op` (rank order is kept).
    """
    size = cc.size
    if size == 1:
        return
    pof2 = pof2_floor(size)
    count = buf.size
    offs = chunk_offsets(count, pof2)
    pipe = Pipe(buf.dtype, count if pof2 != size else offs[pof2 // 2])
    new_rank = fold_in(cc, buf, op, pipe)
    gatherer = root if fold_new_rank(root, size) is not None else root + 1
    new_root = fold_new_rank(gatherer, size)
    if new_rank is not None:
        steps = halve(cc, buf, op, offs, new_rank, pipe)
        for partner, partner_new, keep, other in reversed(steps):
            if (new_rank ^ new_root) & (new_rank ^ partner_new):
                cc.send(buf[offs[keep[0]]:offs[keep[1]]], partner)
                break  # this rank's range now lives with the partner
            cc.recv(buf[offs[other[0]]:offs[other[1]]], partner)
    pipe.close()
    if gatherer != root:
        if cc.rank == gatherer:
            cc.send(buf, root)
        elif cc.rank == root:
            cc.recv(buf, gatherer)
