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
"""

from __future__ import annotations

import numpy as np

from pycomm.algorithms.topology import binomial_children, binomial_parent

__all__ = ["reduce_binomial"]


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
        incoming = np.empty_like(buf)
        for child in children:
            cc.recv(incoming, child)
            op.apply_left(buf, incoming)  # own partial covers the lower vranks
    parent = binomial_parent(rank, size, tree_root)
    if parent is not None:
        cc.send(buf, parent)
    if tree_root != root:
        if rank == tree_root:
            cc.send(buf, root)
        elif rank == root:
            cc.recv(buf, tree_root)
