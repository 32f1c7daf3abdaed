"""Groups and derived communicators on real worlds: Dup, Split, Create, Create_group,
Free and Compare, and the isolation of their traffic from each other's and the world's.

Each test makes one ``world.run``; the ranks return what they observed (ranks, sizes,
members, received values) and the parent checks it against a reference computed here from
(rank, size) alone. Pure Group algebra needs no world and runs in the parent.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

import pycomm

cloudpickle.register_pickle_by_value(sys.modules[__name__])

UNDEFINED = pycomm.UNDEFINED


def split_members(size: int, color_of, key_of) -> dict:
    """Reference Split: color -> parent ranks ordered by (key, parent rank)."""
    parts: dict = {}
    for r in range(size):
        c = color_of(r, size)
        if c != UNDEFINED:
            parts.setdefault(c, []).append((key_of(r, size), r))
    return {c: [r for _, r in sorted(m)] for c, m in parts.items()}


# -- Group algebra (no world) --------------------------------------------------------------

def test_group_incl_excl_order_and_membership():
    g = pycomm.Group([10, 11, 12, 13, 14], my_world_rank=12)
    assert (g.size, g.rank, g.Get_size(), g.Get_rank()) == (5, 2, 5, 2)
    inc = g.Incl([4, 0, 2])
    assert inc._world == [14, 10, 12] and inc.rank == 2
    exc = g.Excl([2, 0])
    assert exc._world == [11, 13, 14] and exc.rank == UNDEFINED
    assert g.Incl([]).size == 0 and g.Excl(range(5)).size == 0


def test_group_set_operations_keep_mpi_order():
    a = pycomm.Group([3, 1, 4, 0], my_world_rank=1)
    b = pycomm.Group([5, 4, 2, 1], my_world_rank=1)
    # MPI: Union = a's members, then b's not in a (in b's order); Intersection and
    # Difference keep a's order. The class form is the one mpi4py 3 and 4 both accept.
    assert pycomm.Group.Union(a, b)._world == [3, 1, 4, 0, 5, 2]
    assert pycomm.Group.Intersection(a, b)._world == [1, 4]
    assert pycomm.Group.Difference(a, b)._world == [3, 0]
    assert pycomm.Group.Difference(b, a)._world == [5, 2]
    assert pycomm.Group.Union(a, b).rank == 1
    assert pycomm.Group.Difference(a, b).rank == UNDEFINED


def test_group_translate_ranks_undefined_where_absent():
    world = pycomm.Group(range(6), my_world_rank=0)
    sub = world.Incl([5, 3, 1])
    assert pycomm.Group.Translate_ranks(world, range(6), sub) == \
        [UNDEFINED, 2, UNDEFINED, 1, UNDEFINED, 0]
    assert pycomm.Group.Translate_ranks(sub, [0, 1, 2], world) == [5, 3, 1]
    assert pycomm.Group.Translate_ranks(sub, [], world) == []


def test_group_translate_ranks_mpi4py4_form():
    """mpi4py 4: ``group1.Translate_ranks(ranks=None, group=None)``; None = COMM_WORLD's."""
    world = pycomm.Group(range(6), my_world_rank=0)
    sub = world.Incl([5, 3, 1])
    assert sub.Translate_ranks([2, 0], world) == [1, 5]
    assert world.Translate_ranks([1, 2], sub) == [2, UNDEFINED]
    assert sub.Translate_ranks() == [5, 3, 1]
    assert sub.Translate_ranks(group=sub) == [0, 1, 2]
    assert sub.Translate_ranks([pycomm.PROC_NULL, 1], world) == [pycomm.PROC_NULL, 3]


def test_group_compare():
    g = pycomm.Group([0, 1, 2], my_world_rank=0)
    assert pycomm.Group.Compare(g, pycomm.Group([0, 1, 2], 1)) == pycomm.IDENT
    assert pycomm.Group.Compare(g, g.Incl([2, 0, 1])) == pycomm.SIMILAR
    assert pycomm.Group.Compare(g, g.Incl([0, 1])) == pycomm.UNEQUAL


@pytest.mark.parametrize("call", [
    lambda g: g.Incl([0, 3]), lambda g: g.Incl([1, 1]), lambda g: g.Excl([-1]),
    lambda g: g.Incl(["0"]), lambda g: pycomm.Group.Translate_ranks(g, [3], g),
    lambda g: pycomm.Group([1, 1], 1),
], ids=["incl-out-of-range", "incl-repeat", "excl-negative", "incl-not-int",
        "translate-out-of-range", "duplicate-member"])
def test_group_bad_ranks_raise(call):
    with pytest.raises(pycomm.ArgumentError):
        call(pycomm.Group([0, 1, 2], my_world_rank=0))


# -- Dup: isolation ------------------------------------------------------------------------

def _rank_dup_p2p():
    world = pycomm.COMM_WORLD
    dup = world.Dup()
    rank, size = world.rank, world.size
    right, left = (rank + 1) % size, (rank - 1) % size
    # Same tag on both; the dup message is sent first, so with mixed matching the world's
    # wildcard receive would take it.
    reqs = [dup.Isend(np.array([100 + rank]), right, tag=7),
            world.Isend(np.array([200 + rank]), right, tag=7)]
    got_world, got_dup = np.zeros(1, int), np.zeros(1, int)
    st = pycomm.Status()
    world.Recv(got_world, pycomm.ANY_SOURCE, pycomm.ANY_TAG, st)
    dup.Recv(got_dup, left, 7)
    pycomm.Request.Waitall(reqs)
    return dict(rank=dup.rank, size=dup.size, world=int(got_world[0]),
                dup=int(got_dup[0]), source=st.source, tag=st.tag)


def test_dup_isolates_point_to_point(world):
    for rank, got in enumerate(world.run(_rank_dup_p2p)):
        left = (rank - 1) % world.size
        assert got == dict(rank=rank, size=world.size, world=200 + left, dup=100 + left,
                           source=left, tag=7), f"rank {rank}"


def _rank_dup_collectives(rounds: int):
    world = pycomm.COMM_WORLD
    dup = world.Dup()
    dup._calls.seq = world._calls.seq   # the same per-call tags on both: only the context separates
    rank = world.rank
    out = []
    for i in range(rounds):
        a = np.full(3, rank + 10 * i, dtype=np.int64)
        b = np.full(3, 1000 * rank + i, dtype=np.int64)
        world.Allreduce(pycomm.IN_PLACE, a)
        dup.Allreduce(pycomm.IN_PLACE, b)
        out.append((int(a[0]), int(b[0])))
    # Reversed order across ranks: the root's dup broadcast is in flight (progress thread)
    # while every other rank receives the world's broadcast carrying the same tag.
    dup._calls.seq = world._calls.seq
    x = np.full(4, 7 if rank == 0 else -1, dtype=np.int32)
    y = np.full(4, 9 if rank == 0 else -1, dtype=np.int32)
    if rank == 0:
        req = dup.Ibcast(x, 0)
        world.Bcast(y, 0)
        req.Wait()
    else:
        world.Bcast(y, 0)
        dup.Bcast(x, 0)
    out.append((int(x.sum()), int(y.sum())))
    return out


def test_dup_isolates_collectives_with_equal_sequence_numbers(world):
    s, rounds = world.size, 12
    tri = s * (s - 1) // 2
    want = [(tri + 10 * i * s, 1000 * tri + i * s) for i in range(rounds)] + [(28, 36)]
    for rank, got in enumerate(world.run(_rank_dup_collectives, rounds)):
        assert got == want, f"rank {rank}"


# -- Split ---------------------------------------------------------------------------------

def color3(r: int, s: int) -> int:
    return UNDEFINED if r % 3 == 2 else r % 3


def key_ties(r: int, s: int) -> int:
    return (s - r) // 2   # descending with parent rank, equal for pairs: ties


def _rank_split(color_of, key_of):
    world = pycomm.COMM_WORLD
    sub = world.Split(color_of(world.rank, world.size), key_of(world.rank, world.size))
    if sub is pycomm.COMM_NULL:
        return dict(null=True, falsy=not sub)
    members = sub.allgather(world.rank)
    total = np.array([world.rank], dtype=np.int64)
    sub.Allreduce(pycomm.IN_PLACE, total)
    # nested: halve again by the sub's rank parity, keyed in reverse
    nested = sub.Split(sub.rank % 2, -sub.rank)
    return dict(null=False, rank=sub.rank, size=sub.size, get=(sub.Get_rank(),
                sub.Get_size()), members=members, total=int(total[0]),
                nested=nested.allgather(world.rank), nested_rank=nested.rank)


@pytest.mark.parametrize("color_of,key_of", [
    (lambda r, s: 0, lambda r, s: 0),
    (lambda r, s: 0, lambda r, s: -r),
    (color3, key_ties),
    (lambda r, s: r % 2, lambda r, s: 0),
    (lambda r, s: UNDEFINED if r == s - 1 else 5, lambda r, s: r % 3),
], ids=["one-part", "reversed", "undefined-and-ties", "parity", "last-undefined"])
def test_split_colors_keys_undefined_and_nested(world, color_of, key_of):
    parts = split_members(world.size, color_of, key_of)
    for rank, got in enumerate(world.run(_rank_split, color_of, key_of)):
        color = color_of(rank, world.size)
        if color == UNDEFINED:
            assert got == dict(null=True, falsy=True), f"rank {rank}"
            continue
        members = parts[color]
        me = members.index(rank)
        nested = [m for i, m in enumerate(members) if i % 2 == me % 2][::-1]
        assert got["rank"] == me and got["size"] == len(members), f"rank {rank}"
        assert got["get"] == (me, len(members))
        assert got["members"] == members, f"rank {rank}: order by (key, parent rank)"
        assert got["total"] == sum(members)
        assert got["nested"] == nested and got["nested_rank"] == nested.index(rank)


def _rank_split_bad(color):
    try:
        pycomm.COMM_WORLD.Split(color, 0)
    except pycomm.ArgumentError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize("color", [-1, 1.5, "red"])
def test_split_bad_color_raises_before_any_byte_moves(world_small, color):
    for rank, msg in enumerate(world_small.run(_rank_split_bad, color)):
        assert "color" in msg and f"rank {rank}" in msg


def _rank_interleaved(rounds: int):
    world = pycomm.COMM_WORLD
    rank = world.rank
    sub = world.Split(rank % 2, rank)
    sub._calls.seq = world._calls.seq   # same per-call tags on the Split and the world
    out = []
    for i in range(rounds):
        a = np.array([rank + i], dtype=np.int64)
        b = np.array([10 * rank + i], dtype=np.int64)
        sub.Allreduce(pycomm.IN_PLACE, a)
        world.Allreduce(pycomm.IN_PLACE, b)
        root = i % sub.size
        c = np.array([1000 * rank + i if sub.rank == root else -1], dtype=np.int64)
        sub.Bcast(c, root)
        d = np.zeros(world.size, dtype=np.int64)
        world.Allgather(np.array([rank * i], dtype=np.int64), d)
        out.append((int(a[0]), int(b[0]), int(c[0]), d.tolist()))
    # nonblocking on the Split, blocking on the world, then the other way round
    a = np.array([rank], dtype=np.int64)
    b = np.array([rank], dtype=np.int64)
    req = sub.Iallreduce(pycomm.IN_PLACE, a)
    world.Allreduce(pycomm.IN_PLACE, b)
    req.Wait()
    out.append((int(a[0]), int(b[0])))
    return out


def test_interleaved_collectives_on_split_and_world(world):
    s, rounds = world.size, 10
    parts = [[r for r in range(s) if r % 2 == c] for c in (0, 1)]
    results = world.run(_rank_interleaved, rounds)
    for rank, got in enumerate(results):
        mine = parts[rank % 2]
        for i in range(rounds):
            root = mine[i % len(mine)]
            want = (sum(mine) + i * len(mine), 10 * s * (s - 1) // 2 + i * s,
                    1000 * root + i, [r * i for r in range(s)])
            assert got[i] == want, f"rank {rank} round {i}"
        assert got[-1] == (sum(mine), s * (s - 1) // 2)


# -- Create, Create_group ------------------------------------------------------------------

def _rank_create():
    world = pycomm.COMM_WORLD
    rank, size = world.rank, world.size
    evens_reversed = [r for r in range(size) if r % 2 == 0][::-1]
    g = world.Get_group().Incl(evens_reversed)
    out = {"group_rank": g.rank}
    c = world.Create(g)
    if c is pycomm.COMM_NULL:
        out["create"] = None
    else:
        out["create"] = (c.rank, c.size, c.allgather(rank))
    # Create_group: only members call; the odd ranks make their own concurrently (tag 3).
    odds = [r for r in range(size) if r % 2 == 1]
    mine = g if rank % 2 == 0 else world.group.Incl(odds)
    cg = world.Create_group(mine, tag=5 if rank % 2 == 0 else 3)
    x = np.array([rank], dtype=np.int64)
    cg.Allreduce(pycomm.IN_PLACE, x)
    out["create_group"] = (cg.rank, cg.size, cg.allgather(rank), int(x[0]))
    # a process outside the group may not call it
    other = world.group.Excl([rank])
    try:
        world.Create_group(other)
        out["outsider"] = "no error"
    except pycomm.ArgumentError as exc:
        out["outsider"] = str(exc)
    # the world still works and no traffic leaked
    world.Barrier()
    return out


def test_create_and_create_group(world):
    s = world.size
    evens = [r for r in range(s) if r % 2 == 0][::-1]
    odds = [r for r in range(s) if r % 2 == 1]
    for rank, got in enumerate(world.run(_rank_create)):
        if rank % 2 == 0:
            assert got["group_rank"] == evens.index(rank)
            assert got["create"] == (evens.index(rank), len(evens), evens)
            assert got["create_group"] == (evens.index(rank), len(evens), evens, sum(evens))
        else:
            assert got["group_rank"] == UNDEFINED and got["create"] is None
            assert got["create_group"] == (odds.index(rank), len(odds), odds, sum(odds))
        assert "not in the group" in got["outsider"], f"rank {rank}: {got['outsider']}"


def _rank_translate():
    world = pycomm.COMM_WORLD
    sub = world.Split(world.rank % 2, -world.rank)
    wg, sg = world.Get_group(), sub.Get_group()
    return (pycomm.Group.Translate_ranks(sg, range(sub.size), wg),
            pycomm.Group.Translate_ranks(wg, range(world.size), sg),
            sg.rank, wg.Compare(world.group))


def test_translate_ranks_between_world_and_split(world):
    s = world.size
    for rank, (to_world, to_sub, sg_rank, cmp) in enumerate(world.run(_rank_translate)):
        members = [r for r in range(s) if r % 2 == rank % 2][::-1]
        assert to_world == members
        assert to_sub == [members.index(r) if r in members else UNDEFINED for r in range(s)]
        assert sg_rank == members.index(rank) and cmp == pycomm.IDENT


# -- Free, Compare -------------------------------------------------------------------------

def _try(fn) -> str:
    try:
        fn()
    except pycomm.CommError as exc:
        return type(exc).__name__
    return "no error"


def _rank_free_collectives():
    world = pycomm.COMM_WORLD
    d = world.Dup()
    d.Barrier()
    d.Free()
    buf = np.zeros(2)
    out = {
        "Barrier": _try(d.Barrier),
        "Allreduce": _try(lambda: d.Allreduce(pycomm.IN_PLACE, buf)),
        "Bcast": _try(lambda: d.Bcast(buf, 0)),
        "Ibarrier": _try(d.Ibarrier),
        "Dup": _try(d.Dup),
        "Split": _try(lambda: d.Split(0, 0)),
        "allgather": _try(lambda: d.allgather(1)),
        "world.Free": _try(world.Free),
    }
    world.Barrier()           # the world is unaffected
    return out


def test_free_then_collective_use_raises(world_small):
    for rank, got in enumerate(world_small.run(_rank_free_collectives)):
        want = {k: "CommError" for k in got}
        want["world.Free"] = "ArgumentError"
        assert got == want, f"rank {rank}"


def _rank_free_p2p():
    world = pycomm.COMM_WORLD
    d = world.Dup()
    d.Free()
    buf = np.zeros(1)
    out = {"Isend": _try(lambda: d.Isend(buf, world.rank, 0)),
           "Irecv": _try(lambda: d.Irecv(buf, world.rank, 0)),
           "Iprobe": _try(lambda: d.Iprobe())}
    world.Barrier()
    return out


def test_free_then_point_to_point_raises(world_small):
    for rank, got in enumerate(world_small.run(_rank_free_p2p)):
        assert got == {"Isend": "CommError", "Irecv": "CommError", "Iprobe": "CommError"}, \
            f"rank {rank}: {got}"


def _rank_compare():
    world = pycomm.COMM_WORLD
    rank = world.rank
    dup = world.Dup()
    rev = world.Split(0, -rank)
    half = world.Split(rank % 2, 0)
    same = world.Split(0, 0)
    return dict(ident=world.Compare(world), dup=world.Compare(dup), dup2=dup.Compare(world),
                rev=world.Compare(rev), half=world.Compare(half), same=world.Compare(same),
                cls=pycomm.Communicator.Compare(dup, dup))


def test_compare(world):
    s = world.size
    for rank, got in enumerate(world.run(_rank_compare)):
        assert got == dict(ident=pycomm.IDENT, dup=pycomm.CONGRUENT, dup2=pycomm.CONGRUENT,
                           rev=pycomm.SIMILAR if s > 1 else pycomm.CONGRUENT,
                           half=pycomm.UNEQUAL if s > 1 else pycomm.CONGRUENT,
                           same=pycomm.CONGRUENT, cls=pycomm.IDENT), f"rank {rank}"


def _rank_derived_basics():
    world = pycomm.COMM_WORLD
    rank = world.rank
    d = world.Dup().Dup()
    sub = world.Split(0, -rank).Dup()
    # p2p on a reordered communicator addresses its own ranks, and Status says so
    right, left = (sub.rank + 1) % sub.size, (sub.rank - 1) % sub.size
    got, st = np.zeros(1, np.int64), pycomm.Status()
    sub.Sendrecv(np.array([rank], np.int64), right, 1, got, pycomm.ANY_SOURCE, 1, st)
    return dict(dup=(d.rank, d.size, d.Get_rank(), d.Get_size()), sub=(sub.rank, sub.size),
                got=int(got[0]), source=st.source, left=left,
                cids=len({world._cid, d._cid, sub._cid}))


def test_rank_size_and_addressing_of_derived_communicators(world):
    s = world.size
    for rank, got in enumerate(world.run(_rank_derived_basics)):
        me = s - 1 - rank
        assert got["dup"] == (rank, s, rank, s)
        assert got["sub"] == (me, s)
        assert got["source"] == got["left"] == (me - 1) % s
        assert got["got"] == s - 1 - got["left"], "sender's world rank"
        assert got["cids"] == 3


def _rank_create_group_lower_tag_after_higher():
    """Create_group numbers its set-up calls by tag, so a later call may carry lower
    numbers than an earlier one; a rank still between the two that takes in the fast
    ranks' messages of the second must not take them for leftovers of a finished call."""
    import time
    world = pycomm.COMM_WORLD
    rank, size = world.rank, world.size
    everyone = world.Get_group()
    first = world.Create_group(everyone, tag=5)
    if rank == size - 1:                     # the slow one: it makes progress meanwhile
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            world.Iprobe(pycomm.ANY_SOURCE, 99)
    second = world.Create_group(everyone, tag=0)
    x = np.array([rank + 1], dtype=np.int64)
    second.Allreduce(pycomm.IN_PLACE, x)
    out = (first.size, second.size, int(x[0]))
    first.Free()
    second.Free()
    world.Barrier()
    return out


def test_create_group_with_a_lower_tag_after_a_higher_one(world):
    s = world.size
    for got in world.run(_rank_create_group_lower_tag_after_higher):
        assert tuple(got) == (s, s, s * (s + 1) // 2)
