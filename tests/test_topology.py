"""Exhaustive checks of pycomm.topology for every size 1..16 (and every root)."""

from __future__ import annotations

import pytest

from pycomm import topology as t

SIZES = range(1, 17)


@pytest.mark.parametrize("size", SIZES)
def test_pof2_helpers(size):
    q = t.pof2_floor(size)
    assert t.is_pof2(q) and q <= size < 2 * q
    assert t.is_pof2(size) == (q == size)
    assert 2 ** t.ceil_log2(size) >= size
    assert t.ceil_log2(size) == 0 or 2 ** (t.ceil_log2(size) - 1) < size


@pytest.mark.parametrize("count", [0, 1, 2, 5, 16, 17, 100])
@pytest.mark.parametrize("nchunks", SIZES)
def test_chunk_offsets(count, nchunks):
    offs = t.chunk_offsets(count, nchunks)
    assert len(offs) == nchunks + 1 and offs[0] == 0 and offs[-1] == count
    sizes = [b - a for a, b in zip(offs[:-1], offs[1:], strict=True)]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # chunk 0 is a largest one


@pytest.mark.parametrize("size", SIZES)
def test_ring_neighbors(size):
    for rank in range(size):
        left, right = t.ring_neighbors(rank, size)
        assert t.ring_neighbors(right, size)[0] == rank
        assert t.ring_neighbors(left, size)[1] == rank
    # following `right` visits every rank once
    seen, r = [], 0
    for _ in range(size):
        seen.append(r)
        r = t.ring_neighbors(r, size)[1]
    assert sorted(seen) == list(range(size)) and r == 0


@pytest.mark.parametrize("size", SIZES)
def test_binomial_tree(size):
    for root in range(size):
        assert t.binomial_parent(root, size, root) is None
        depth = {root: 0}
        frontier = [root]
        while frontier:  # breadth-first walk from the root over children
            nxt = []
            for r in frontier:
                kids = t.binomial_children(r, size, root)
                dist = [(k - r) % size for k in kids]
                assert dist == sorted(dist) and len(set(kids)) == len(kids)
                for k in kids:
                    assert k not in depth, "a rank reached twice: not a tree"
                    assert t.binomial_parent(k, size, root) == r
                    depth[k] = depth[r] + 1
                    nxt.append(k)
            frontier = nxt
        assert sorted(depth) == list(range(size))  # spanning
        assert max(depth.values()) <= t.ceil_log2(size)
        for r in range(size):
            kids = t.binomial_children(r, size, root)
            sub = t.binomial_subtree_size(r, size, root)
            assert sub == 1 + sum(t.binomial_subtree_size(k, size, root) for k in kids)
            # the subtree is the contiguous vrank range [v, v + sub), children in order
            v = (r - root) % size
            start = v + 1
            for k in kids:
                kv = (k - root) % size
                assert kv == start
                start += t.binomial_subtree_size(k, size, root)
            assert start == v + sub <= size


@pytest.mark.parametrize("size", SIZES)
def test_fold(size):
    q = t.pof2_floor(size)
    new = [t.fold_new_rank(r, size) for r in range(size)]
    kept = [(r, n) for r, n in enumerate(new) if n is not None]
    assert [n for _, n in kept] == list(range(q))  # bijection onto 0..q-1, increasing
    assert len([n for n in new if n is None]) == size - q
    for r, n in kept:
        assert t.fold_real_rank(n, size) == r
    for r, n in enumerate(new):
        if n is None:  # folded-out evens hand to the odd rank above, which is kept
            assert r % 2 == 0 and new[r + 1] is not None


@pytest.mark.parametrize("size", SIZES)
def test_hypercube_partners(size):
    q = t.pof2_floor(size)
    for n in range(q):
        partners = t.hypercube_partners(n, q)
        assert len(partners) == t.ceil_log2(q)
        for k, m in enumerate(partners):
            assert 0 <= m < q and t.hypercube_partners(m, q)[k] == n  # involution per step
        # after all steps, n has (transitively) combined with every new rank
        group = {n}
        for k in range(len(partners)):
            group |= {g ^ (1 << k) for g in group}
        assert group == set(range(q))


@pytest.mark.parametrize("size", SIZES)
def test_dissemination(size):
    rounds = [t.dissemination_peers(r, size) for r in range(size)]
    assert all(len(x) == t.ceil_log2(size) for x in rounds)
    heard = [{r} for r in range(size)]  # ranks known to have arrived, per rank
    for k in range(t.ceil_log2(size)):
        for r in range(size):
            to, frm = rounds[r][k]
            assert rounds[to][k][1] == r and rounds[frm][k][0] == r  # sends match receives
        heard = [heard[r] | heard[rounds[r][k][1]] for r in range(size)]
    assert all(h == set(range(size)) for h in heard)


@pytest.mark.parametrize("nbits", range(0, 6))
def test_bit_reverse(nbits):
    values = [t.bit_reverse(v, nbits) for v in range(1 << nbits)]
    assert sorted(values) == list(range(1 << nbits))  # a permutation
    assert all(t.bit_reverse(w, nbits) == v for v, w in enumerate(values))  # an involution
    assert nbits < 3 or t.bit_reverse(1, nbits) == 1 << (nbits - 1)


def _check_in_order_tree(size, parent_of, children_of, root):
    """Spanning tree, at most two children, depth <= ceil(log2 size), and every subtree a
    contiguous rank range with at most one child below its rank and one above."""
    assert parent_of(root) is None
    for r in range(size):
        kids = children_of(r)
        assert kids == sorted(kids) and len(kids) <= 2
        assert sum(k < r for k in kids) <= 1 and sum(k > r for k in kids) <= 1
        assert all(parent_of(k) == r for k in kids)
        assert sorted(k for k in range(size) if parent_of(k) == r) == kids
    members = {}

    def walk(r, depth):
        assert depth <= t.ceil_log2(size), "too deep"
        got = {r}
        for k in children_of(r):
            got |= walk(k, depth + 1)
        assert got == set(range(min(got), max(got) + 1)), f"subtree of {r} not contiguous"
        members[r] = got
        return got

    assert walk(root, 0) == set(range(size))


@pytest.mark.parametrize("size", SIZES)
def test_btree(size):
    _check_in_order_tree(size, lambda r: t.btree_parent(r, size),
                         lambda r: t.btree_children(r, size), 0)


@pytest.mark.parametrize("size", SIZES)
def test_double_binary_tree(size):
    trees = [t.double_binary_tree(r, size) for r in range(size)]
    for k, root in ((0, 0), (1, size - 1)):
        _check_in_order_tree(size, lambda r: trees[r][k][0], lambda r: trees[r][k][1], root)
    if size % 2 == 0:  # complementary: no rank is inner in both trees
        inner = [[bool(trees[r][k][1]) for r in range(size)] for k in (0, 1)]
        assert not any(a and b for a, b in zip(*inner, strict=True))


@pytest.mark.parametrize("count", [0, 1, 5, 16, 17])
@pytest.mark.parametrize("segment", [1, 3, 16, 100])
def test_segment_offsets(count, segment):
    offs = t.segment_offsets(count, segment)
    assert offs[0] == 0 and offs[-1] == count
    sizes = [b - a for a, b in zip(offs[:-1], offs[1:], strict=True)]
    assert len(sizes) == -(-count // segment)
    assert all(s == segment for s in sizes[:-1]) and all(0 < s <= segment for s in sizes)
