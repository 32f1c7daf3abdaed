"""Communication topologies as small pure functions of (rank, size).

Every collective schedule in :mod:`pycomm.collectives` asks this module who its peers are;
nothing here sends a byte, so each function is tested exhaustively for sizes 1..16 in
``tests/test_topology.py``.

Words used throughout:

* **vrank** (virtual rank): a rank renumbered so that the root of a rooted collective is
  0, ``vrank = (rank - root) mod size``.
* **pof2**: the largest power of two ``<= size``; ``rem = size - pof2``.
* **new rank**: a rank's number in the power-of-two group left after the non-power-of-two
  *fold* (Thakur, Rabenseifner & Gropp 2005, section 4.3); folded-out ranks have none.
* **chunk**: one of the nearly equal pieces a vector of ``count`` elements is cut into.
* **segment**: one of the fixed-size pieces a pipelined schedule streams a vector in.

Sources: MPICH ``src/mpi/coll`` (binomial trees, the fold), NCCL ``graph/trees.cc`` (the
habit of drawing the tree next to the code, and the double binary tree), Hensgen, Finkel &
Manber 1988 (dissemination), Sanders, Speck & Träff 2009 (two-tree collectives).
"""

from __future__ import annotations

__all__ = [
    "is_pof2", "pof2_floor", "ceil_log2", "chunk_offsets", "ring_neighbors",
    "binomial_parent", "binomial_children", "binomial_subtree_size",
    "fold_new_rank", "fold_real_rank", "hypercube_partners", "dissemination_peers",
    "bit_reverse", "btree_parent", "btree_children", "double_binary_tree", "segment_offsets",
    "grid_2d",
]


def is_pof2(size: int) -> bool:
    """Return True when ``size`` is a power of two (1, 2, 4, ...)."""
    return size > 0 and size & (size - 1) == 0


def pof2_floor(size: int) -> int:
    """Return the largest power of two ``<= size`` (``size >= 1``)."""
    return 1 << (size.bit_length() - 1)


def ceil_log2(size: int) -> int:
    """Return ``ceil(log2(size))``: rounds of a binomial tree or dissemination (0 for 1)."""
    return (size - 1).bit_length()


def chunk_offsets(count: int, nchunks: int) -> list[int]:
    """Cut ``count`` elements into ``nchunks`` nearly equal contiguous chunks.

    The first ``count % nchunks`` chunks get one element more, so chunk sizes differ by at
    most one and chunks may be empty when ``count < nchunks``. Chunk ``i`` is
    ``buf[offs[i]:offs[i + 1]]``.

    Args:
        count: elements in the vector (``>= 0``).
        nchunks: number of chunks (``>= 1``).

    Returns:
        ``nchunks + 1`` non-decreasing offsets, ``offs[0] == 0``, ``offs[-1] == count``.
    """
    base, extra = divmod(count, nchunks)
    return [i * base + min(i, extra) for i in range(nchunks + 1)]


def ring_neighbors(rank: int, size: int) -> tuple[int, int]:
    """Return ``(left, right)`` neighbours on the ring ``0 -> 1 -> ... -> size-1 -> 0``.

    Data flows rightwards: a rank receives from ``left`` and sends to ``right``::

        left = rank-1  ──►  rank  ──►  right = rank+1      (indices mod size)

    With ``size == 1`` both neighbours are the rank itself (ring algorithms do no step).
    """
    return (rank - 1) % size, (rank + 1) % size


def _lowbit(vrank: int, size: int) -> int:
    """Lowest set bit of ``vrank``; for the root (vrank 0) a power of two ``>= size``."""
    return vrank & -vrank if vrank else 1 << ceil_log2(size)


def binomial_parent(rank: int, size: int, root: int) -> int | None:
    """Return the parent of ``rank`` in the binomial tree rooted at ``root``.

    In vrank numbering the parent is the vrank with its lowest set bit cleared. For
    ``size = 8`` (vranks; the edge label is the mask, i.e. the distance)::

        0 ──1── 1
        ├──2── 2 ──1── 3
        └──4── 4 ──1── 5
               └──2── 6 ──1── 7

    Returns:
        The parent's real rank, or None for the root.
    """
    vrank = (rank - root) % size
    if vrank == 0:
        return None
    return ((vrank & (vrank - 1)) + root) % size


def binomial_children(rank: int, size: int, root: int) -> list[int]:
    """Return the children of ``rank`` in the binomial tree rooted at ``root``.

    Child ``vrank + mask`` for every power of two ``mask`` below the lowest set bit of
    ``vrank`` (any mask for the root) with ``vrank + mask < size``. The child at distance
    ``mask`` owns the vranks ``[vrank + mask, vrank + 2*mask)`` (clipped at ``size``).

    Returns:
        Real ranks in ascending distance (``mask = 1, 2, 4, ...``): the order in which a
        reduction must fold them so that vrank order is kept; broadcasts send in reverse
        (largest subtree first).
    """
    vrank = (rank - root) % size
    limit = _lowbit(vrank, size)
    children = []
    mask = 1
    while mask < limit and vrank + mask < size:
        children.append((vrank + mask + root) % size)
        mask <<= 1
    return children


def binomial_subtree_size(rank: int, size: int, root: int) -> int:
    """Return how many ranks the subtree of ``rank`` holds (itself included).

    The subtree of vrank ``v`` is the contiguous vrank range ``[v, v + lowbit(v))``
    clipped at ``size``; gather/scatter move exactly this many blocks across the edge.
    """
    vrank = (rank - root) % size
    return min(_lowbit(vrank, size), size - vrank)


def fold_new_rank(rank: int, size: int) -> int | None:
    """Map a real rank to its new rank in the power-of-two group, or None if folded out.

    The first ``2*rem`` ranks pair up; each even one hands its data to the odd one above
    and sits out (Thakur, Rabenseifner & Gropp 2005, section 4.3). ``size = 6``
    (``pof2 = 4``, ``rem = 2``)::

        real:  0   1   2   3   4   5
               └─►─┘   └─►─┘
        new:   -   0   -   1   2   3

    The map is increasing, so new-rank order is real-rank order (non-commutative ops keep
    their order through the fold).
    """
    rem = size - pof2_floor(size)
    if rank < 2 * rem:
        return None if rank % 2 == 0 else rank // 2
    return rank - rem


def fold_real_rank(new_rank: int, size: int) -> int:
    """Inverse of :func:`fold_new_rank`: the real rank that plays ``new_rank``."""
    rem = size - pof2_floor(size)
    return 2 * new_rank + 1 if new_rank < rem else new_rank + rem


def hypercube_partners(new_rank: int, pof2: int) -> list[int]:
    """Partners of ``new_rank`` in recursive doubling/halving, distance 1, 2, 4, ...

    Step ``k`` pairs ``new_rank`` with ``new_rank XOR 2**k``; after step ``k`` each rank has
    combined the aligned block of ``2**(k+1)`` new ranks containing it. ``pof2 = 8``::

        step 0:  0-1  2-3  4-5  6-7
        step 1:  0-2  1-3  4-6  5-7
        step 2:  0-4  1-5  2-6  3-7

    Returns:
        ``log2(pof2)`` new ranks (map to real ranks with :func:`fold_real_rank`).
    """
    partners = []
    mask = 1
    while mask < pof2:
        partners.append(new_rank ^ mask)
        mask <<= 1
    return partners


def dissemination_peers(rank: int, size: int) -> list[tuple[int, int]]:
    """Per-round ``(send_to, recv_from)`` of the dissemination barrier.

    Round ``k`` signals ``rank + 2**k`` and waits for ``rank - 2**k`` (mod size); after
    ``ceil(log2 size)`` rounds every rank has transitively heard from every other.
    ``size = 5``, round 1 (distance 2)::

        0 ──► 2 ──► 4 ──► 1 ──► 3 ──► 0
    """
    peers = []
    dist = 1
    while dist < size:
        peers.append(((rank + dist) % size, (rank - dist) % size))
        dist <<= 1
    return peers


def bit_reverse(value: int, nbits: int) -> int:
    """Return ``value`` with its lowest ``nbits`` bits in reverse order (``0 <= value < 2**nbits``).

    Recursive halving with distance 1 first leaves new rank ``r`` owning chunk position
    ``bit_reverse(r, log2 q)``; laying chunks out in this order gives every rank its own.
    """
    out = 0
    for _ in range(nbits):
        out = (out << 1) | (value & 1)
        value >>= 1
    return out


def btree_parent(rank: int, size: int) -> int | None:
    """Parent of ``rank`` in NCCL's in-order binary tree rooted at rank 0 (``ncclGetBtree``).

    A rank whose lowest set bit is ``b`` hangs below ``(rank ^ b) | 2b`` (or ``rank ^ b``
    when that is out of range); rank 0 has one child, the largest power of two below
    ``size``. ``size = 8``, and ``size = 6``::

        0                          0
        └── 4                      └── 4
            ├── 2                      ├── 2
            │   ├── 1                  │   ├── 1
            │   └── 3                  │   └── 3
            └── 6                      └── 5
                ├── 5
                └── 7

    The tree is in order: the subtree of a rank with lowest bit ``b`` is the contiguous
    rank range ``[rank - b + 1, rank + b - 1]`` (clipped at ``size``) with at most one child
    below ``rank`` and one above, so ``lower ∘ own ∘ higher`` keeps rank order. Depth is
    ``ceil(log2 size)``; half the ranks (the odd ones) are leaves.

    Returns:
        The parent rank, or None for rank 0.
    """
    if rank == 0:
        return None
    bit = rank & -rank
    up = (rank ^ bit) | (bit << 1)
    return up if up < size else rank ^ bit


def btree_children(rank: int, size: int) -> list[int]:
    """Children of ``rank`` in the tree of :func:`btree_parent`, ascending (at most two)."""
    if size == 1:
        return []
    if rank == 0:
        return [pof2_floor(size - 1)]
    half = (rank & -rank) >> 1
    if half == 0:
        return []
    children = [rank - half]
    while half and rank + half >= size:
        half >>= 1
    if half:
        children.append(rank + half)
    return children


def double_binary_tree(rank: int, size: int) -> list[tuple[int | None, list[int]]]:
    """``[(parent, children), (parent, children)]`` of ``rank`` in NCCL's two trees.

    Tree 0 is :func:`btree_parent`'s tree (root 0); tree 1 is its mirror image ``r ->
    size-1-r`` (root ``size - 1``). For even ``size`` every rank is a leaf in one tree and
    inner in the other, so each rank forwards about one tree's traffic. ``size = 8``::

        tree 0:  0─4, 4─{2,6}, 2─{1,3}, 6─{5,7}      inner 0 2 4 6, leaves 1 3 5 7
        tree 1:  7─3, 3─{1,5}, 5─{4,6}, 1─{0,2}      inner 7 5 3 1, leaves 6 4 2 0

    NCCL shifts by one instead of mirroring when ``size`` is odd (better balance there);
    the mirror is kept for every size because it keeps each subtree a contiguous rank
    range, so non-commutative ops still combine in rank order.

    Returns:
        Per tree the parent (None at the root) and the children in ascending rank order.
    """
    mirror = size - 1 - rank
    up = btree_parent(mirror, size)
    return [(btree_parent(rank, size), btree_children(rank, size)),
            (None if up is None else size - 1 - up,
             sorted(size - 1 - c for c in btree_children(mirror, size)))]


def segment_offsets(count: int, segment: int) -> list[int]:
    """Cut ``count`` elements into segments of ``segment`` elements (the last may be short).

    Args:
        count: elements in the vector (``>= 0``).
        segment: elements per segment (``>= 1``).

    Returns:
        ``ceil(count / segment) + 1`` offsets from 0 to ``count`` (just ``[0]`` when
        ``count == 0``: no segment at all).
    """
    return list(range(0, count, segment)) + [count]


def grid_2d(size: int) -> tuple[int, int]:
    """Return ``(rows, cols)`` of the near-square grid of the 2-D collectives.

    ``rows`` is the largest divisor of ``size`` not above ``sqrt(size)`` and ``cols =
    size // rows``, so ``rows <= cols`` and ``rows * cols == size``; row ``i`` holds the
    consecutive ranks ``i*cols .. i*cols + cols - 1``, column ``j`` the ranks ``j, cols + j,
    ...``. A size with no such divisor (1 and the primes) gets a 1-D grid, ``(1, size)``:
    one row, and the 2-D schedule reduces to its row phases::

        size 6: 2 x 3     size 8: 2 x 4     size 9: 3 x 3     size 7: 1 x 7
          0 1 2             0 1 2 3           0 1 2             0 1 2 3 4 5 6
          3 4 5             4 5 6 7           3 4 5
                                              6 7 8
    """
    rows = max(d for d in range(1, int(size ** 0.5) + 1) if size % d == 0) if size > 0 else 1
    return rows, max(1, size // rows)
