"""Communication topologies as small pure functions of (rank, size).

Every collective schedule in :mod:`pycomm.algorithms` asks this module who its peers are;
nothing here sends a byte, so each function is tested exhaustively for sizes 1..16 in
``tests/test_topology.py``.

Words used throughout:

* **vrank** (virtual rank): a rank renumbered so that the root of a rooted collective is
  0, ``vrank = (rank - root) mod size``.
* **pof2**: the largest power of two ``<= size``; ``rem = size - pof2``.
* **new rank**: a rank's number in the power-of-two group left after the non-power-of-two
  *fold* (Thakur, Rabenseifner & Gropp 2005, section 4.3); folded-out ranks have none.
* **chunk**: one of the nearly equal pieces a vector of ``count`` elements is cut into.

Sources: MPICH ``src/mpi/coll`` (binomial trees, the fold), NCCL ``graph/trees.cc`` (the
habit of drawing the tree next to the code), Hensgen, Finkel & Manber 1988 (dissemination).
"""

from __future__ import annotations

__all__ = [
    "is_pof2", "pof2_floor", "ceil_log2", "chunk_offsets", "ring_neighbors",
    "binomial_parent", "binomial_children", "binomial_subtree_size",
    "fold_new_rank", "fold_real_rank", "hypercube_partners", "dissemination_peers",
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
