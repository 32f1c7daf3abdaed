"""Hierarchical (two-level, topology-aware) collectives for communicators that span hosts.

A communicator's ``host_layout`` (:class:`pycomm.launch.bootstrap.HostLayout`: which of its ranks
share a host) splits it into two kinds of groups, the *sub-communicators* of this module
(:class:`Plan`, built once per layout and cached):

* **local**: the ranks of one host, in rank order (shared memory between them);
* **cross** ``j``: local rank ``j`` of every host, in host order (one per local rank,
  ``j < m`` where ``m`` is the fewest ranks any host has), and **leaders**: one rank per
  host (its lowest rank, or the root on the root's host).

Example, 2 hosts x 2 ranks, cyclic placement (host 0 holds ranks 0 and 2)::

    host 0: [0, 2]  --- cross 0: [0, 1]  --- host 1: [1, 3]
                    --- cross 1: [2, 3]  ---

Bcast and barrier are compositions of the flat schedules of :mod:`pycomm.collectives`,
run on views of the call (:class:`View`: a group's ranks renumbered ``0..k-1``, sending on
the call's own context, tag and signature), each inner step's algorithm chosen by the cost
model for its group size, bytes and link (``shm`` inside a host, the link between hosts
across them). All-reduce, reduce and all-gather are pipelined schedules of direct
exchanges (:func:`_ticks`). The groups need no context id of their own (so building them
needs no message, and they work inside a nonblocking collective's progress thread): within
one call every rank sends to a given peer in the order that peer receives.

Notation: ``H`` hosts, ``m`` the fewest ranks on a host, ``L`` the ranks on a host, ``n``
bytes, ``β_net`` seconds per byte of a host's link.

**allreduce** (Horovod's hierarchical allreduce, Sergeev & Del Balso 2018; NCCL's ring and
tree across nodes, whose every channel is driven by a different local GPU and which
pipelines in chunks; inner exchanges: the pairwise-exchange reduce-scatter and all-gather
of Thakur, Rabenseifner & Gropp 2005, 4.1, with all peers at once). The vector is cut into
pieces of :data:`PIECE_BYTES`, a piece into ``m`` slices (slice ``j`` owned by local rank
``j`` of every host; local ranks ``>= m`` own none), a slice into ``H`` sub-chunks (one per
host). Per piece: (1) every local rank sends its share of each slice to the slice's owner,
who folds them in (reduce-scatter in the host, over shared memory); (2) the ``m`` owners of
slice ``j`` (one per host) reduce-scatter it across hosts, sub-chunk ``g`` to host ``g``,
and (3) all-gather the reduced sub-chunks back: every local rank drives the link at once;
(4) each owner sends its reduced slice to its host's other ranks. The stages of
consecutive pieces overlap (stage ``s`` of piece ``k`` at tick ``k + 2s``; every rank posts
in the same order, so one tag serves the call), so the link is busy while ranks fold and
copy inside their hosts. Bytes each host sends over its link: ``2(H-1)/H n``, the minimum
(all-reduce lower bound); per piece of ``b`` bytes and rank: ``2(L-1)`` local messages of
``b/m``, ``2(H-1)`` cross messages of ``b/(mH)``. Time about
``max(2(H-1)/H n β_net, local copies and folds) + a piece's latency``. Operands are combined
host by host, not in rank order: commutative ops only. Each element is folded by one rank
and copied to the others, so every rank ends with the same bytes.

**reduce** (the all-reduce's first half, then a gather: Rabenseifner's reduce, Thakur et
al. 2005, 4.2, with the hierarchy): stages (1)-(2) of the all-reduce, then every owner of a
reduced sub-chunk sends it straight to the root, pipelined likewise. The busiest link
carries ``n`` (a non-root host's: its half of the reduce-scatter and its reduced halves),
every local rank driving it. Commutative ops only.

**bcast** (MPICH's SMP-aware ``MPIR_Bcast_intra_smp``): across the hosts' leaders from
the root (the root leads its host), then inside each host from its leader; ``n`` bytes
cross each link once.

**allgather** (the hierarchy of the all-reduce, with its second half's direct exchanges;
cf. MPICH's SMP-aware all-gathers, which gather inside a node first). Every rank sends its
block to one rank of each other host (local rank ``j mod L_g`` of host ``g``: every local
rank drives the link), then each rank sends its own block and the blocks it received to
the other ranks of its host; received straight into ``buf`` (no packing, any placement),
pipelined in pieces as the all-reduce. Each host's link carries its own blocks once to
each other host: the minimum.

**barrier**: zero-byte fan-in to each host's leader, a dissemination barrier across the
leaders (Hensgen, Finkel & Manber 1988), zero-byte fan-out.

Any placement (block, cyclic, irregular) and uneven hosts (e.g. 3 + 2 ranks) are served; a
communicator on one host runs only the local steps.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from pycomm import config
from pycomm.collectives.barrier import barrier_dissemination
from pycomm.tuning.cost import DEFAULT_TRANSPORT, model_transport
from pycomm.collectives.flat import bound, cheapest
from pycomm.collectives.scratch import give, take
from pycomm.topology import chunk_offsets

__all__ = ["HIERARCHICAL", "Plan", "View", "plan_of", "allreduce_hierarchical",
           "reduce_hierarchical", "bcast_hierarchical", "allgather_hierarchical",
           "barrier_hierarchical"]

HIERARCHICAL = "hierarchical"
_EMPTY = np.empty(0, dtype=np.uint8)


@dataclass(frozen=True)
class Plan:
    """The groups of one communicator layout, seen from one rank (built once, cached).

    Attributes:
        hosts: each host's ranks, in rank order; hosts ordered by lowest rank.
        host: this rank's host; ``local``: its ranks (``hosts[host]``).
        local_rank: this rank's index in ``local``.
        slices: ``m``, the fewest ranks of any host: slices of an all-reduce, cross groups.
        cross: local rank ``local_rank`` of every host (host order), or None when this
            rank owns no slice (``local_rank >= m``).
        leaders: each host's lowest rank.
        block: hosts hold consecutive ranks in host order (block placement), so a host's
            blocks of an all-gather are contiguous and in order.
    """

    hosts: tuple[tuple[int, ...], ...]
    host: int
    local_rank: int
    slices: int
    cross: tuple[int, ...] | None
    leaders: tuple[int, ...]
    block: bool

    @property
    def local(self) -> tuple[int, ...]:
        return self.hosts[self.host]


@functools.lru_cache(maxsize=256)
def _plan(hosts: tuple[tuple[int, ...], ...], host: int, local_rank: int) -> Plan:
    slices = min(len(g) for g in hosts)
    cross = tuple(g[local_rank] for g in hosts) if local_rank < slices else None
    flat = [r for g in hosts for r in g]
    return Plan(hosts, host, local_rank, slices, cross, tuple(g[0] for g in hosts),
                flat == list(range(len(flat))))


_PLANS: dict[int, tuple] = {}      # id(layout) -> (layout, its Plan): no hashing per call


def plan_of(cc) -> Plan:
    """The :class:`Plan` of the call's communicator (``cc.comm.host_layout``; a
    communicator without a layout is treated as one host). Cached per layout object, so
    a call pays one dict lookup, whatever the number of ranks."""
    layout = getattr(getattr(cc, "comm", None), "host_layout", None)
    if layout is None:
        return _plan((tuple(range(cc.size)),), 0, cc.rank)
    hit = _PLANS.get(id(layout))
    if hit is None or hit[0] is not layout:
        if len(_PLANS) > 256:
            _PLANS.clear()
        hit = _PLANS[id(layout)] = (layout, _plan(layout.hosts, layout.host,
                                                  layout.local_rank))
    return hit[1]


class View:
    """Some ranks of a collective call, renumbered ``0..size-1``: the ``cc`` contract of
    :mod:`pycomm.collectives` (``rank``, ``size``, ``isend``, ``irecv``, ``waitall``,
    ``send``, ``recv``, ``sendrecv``), so that any flat schedule runs on the group.

    Args:
        cc: the call's collective context.
        ranks: the group's ranks in ``cc``, in the group's rank order; must hold ``cc.rank``.
    """

    __slots__ = ("cc", "ranks", "rank", "size")

    def __init__(self, cc, ranks):
        self.cc, self.ranks = cc, ranks
        self.rank, self.size = ranks.index(cc.rank), len(ranks)

    def isend(self, buf: np.ndarray, dest: int):
        return self.cc.isend(buf, self.ranks[dest])

    def irecv(self, buf: np.ndarray, source: int):
        return self.cc.irecv(buf, self.ranks[source])

    def waitall(self, reqs) -> None:
        self.cc.waitall(reqs)

    def send(self, buf: np.ndarray, dest: int) -> None:
        self.cc.send(buf, self.ranks[dest])

    def recv(self, buf: np.ndarray, source: int) -> None:
        self.cc.recv(buf, self.ranks[source])

    def sendrecv(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray,
                 source: int) -> None:
        self.cc.sendrecv(sendbuf, self.ranks[dest], recvbuf, self.ranks[source])


def _inner(collective: str, nbytes: int, size: int, commutative: bool, transport: str):
    """The flat algorithm the cost model picks for one inner step
    (:func:`pycomm.collectives.flat.cheapest`; PYCOMM_ALGORITHM_* names the whole call's
    algorithm, not its steps'); made again after :func:`pycomm.config.reload`, as the
    communicators' plans are."""
    return _inner_at(collective, nbytes, size, commutative, transport, config.generation)


@functools.lru_cache(maxsize=1024)
def _inner_at(collective: str, nbytes: int, size: int, commutative: bool, transport: str,
              generation: int):
    info = cheapest(collective, nbytes, size, commutative, transport)
    return bound(info, nbytes, size, transport)


def _net(cc) -> str:
    """The cost table of the links between hosts (``net`` when measured, else the
    communicator's slowest transport)."""
    return model_transport(getattr(getattr(cc, "comm", None), "transport_name", None), 2)


# Bytes of the vector per pipeline piece of the all-reduce: smaller pieces pay more Python
# per byte, larger ones a longer pipeline fill (the sizes measured: benchmarks/README.md,
# "Measurements behind design choices in the code").
PIECE_BYTES = 2 << 20


def allreduce_hierarchical(cc, buf: np.ndarray, op, *, piece_bytes: int | None = None) -> None:
    """Two-level all-reduce: reduce-scatter in each host, all-reduce of each slice across
    hosts (every local rank at once), all-gather in each host; pipelined in pieces.

    Args:
        cc: the collective context; ``cc.comm.host_layout`` gives the hosts.
        buf: 1-D C-contiguous array of ``count`` elements (any dtype the op serves), the
            same count and dtype on every rank; this rank's contribution on entry, the
            result on return (bit-identical on every rank).
        op: a commutative :class:`pycomm.ops.Op` (operands combine host by host).
        piece_bytes: bytes per pipeline piece (default :data:`PIECE_BYTES`); the same on
            every rank. Tests pass tiny ones to run many pieces on small vectors.
    """
    plan = plan_of(cc)
    count = buf.size
    if count == 0 or cc.size == 1:
        return
    per = PIECE_BYTES if piece_bytes is None else max(1, int(piece_bytes))
    npieces = min(count, max(1, -(-buf.nbytes // per)))
    pieces = chunk_offsets(count, npieces)
    run = _Pieces(cc, plan, buf, op)
    # A lag of two ticks between a piece's stages keeps about four pieces' cross-host
    # messages in flight, so the link does not idle while a rank folds a piece or waits
    # on its host.
    _ticks(cc, npieces, _STAGES, lambda s, k: run.stage(s, k, pieces[k], pieces[k + 1]))


_LAG = 2        # ticks between two stages of a piece
_STAGES = 5     # local reduce-scatter, cross reduce-scatter, cross all-gather, local
                # all-gather, completion


class _Pieces:
    """The stages of :func:`allreduce_hierarchical` (with ``root``, of
    :func:`reduce_hierarchical`: the last two replaced by sending to the root) for one
    piece ``[a, b)`` of ``buf``.

    The piece is cut into ``m`` slices (:class:`Plan` ``slices``), slice ``j`` owned by
    local rank ``j`` of every host; a slice is cut into ``H`` sub-chunks, sub-chunk ``g``
    owned by host ``g``'s owner of the slice. Each stage posts nonblocking messages and
    returns them; the caller waits for them before the piece's next stage. Every exchange
    inside a stage is direct (each peer at once: the pairwise exchange of Thakur et al.
    2005, 4.1, without its steps), so no stage waits on another inside itself.
    """

    def __init__(self, cc, plan: Plan, buf: np.ndarray, op, root: int | None = None):
        self.cc, self.plan, self.buf, self.op, self.root = cc, plan, buf, op, root
        self.me = plan.local_rank
        self.others = [r for r in plan.local if r != cc.rank]
        self.scratch: dict[int, np.ndarray] = {}

    def _fold(self, k: int, into: np.ndarray, parts: int) -> None:
        """Fold the ``parts`` contributions piece ``k``'s last stage received into ``into``."""
        scr, n = self.scratch.pop(k, None), into.size
        for t in range(parts if scr is not None and n else 0):
            self.op.apply(scr[t * n:(t + 1) * n], into)
        if scr is not None:
            give(scr)

    def stage(self, s: int, k: int, a: int, b: int) -> list:
        cc, plan, buf, me = self.cc, self.plan, self.buf, self.me
        m, local, cross, root = plan.slices, plan.local, plan.cross, self.root
        nh, h = len(plan.hosts), plan.host
        so = chunk_offsets(b - a, m)
        part = [buf[a + so[q]:a + so[q + 1]] for q in range(m)]
        mine = part[me] if me < m else buf[a:a]
        co = chunk_offsets(mine.size, nh)
        sub = [mine[co[g]:co[g + 1]] for g in range(nh)]
        peers = [g for g in range(nh) if g != h]
        reqs = []
        if s == 0:      # local reduce-scatter: my share of every slice to its owner
            reqs = [cc.isend(part[q], local[q]) for q in range(m) if q != me and part[q].size]
            if mine.size and self.others:
                n = mine.size
                scr = self.scratch[k] = take(n * len(self.others), buf.dtype)
                reqs += [cc.irecv(scr[t * n:(t + 1) * n], r) for t, r in enumerate(self.others)]
        elif s == 1 and mine.size:  # fold in the host's shares, then cross reduce-scatter
            self._fold(k, mine, len(self.others))
            if nh > 1:
                reqs = [cc.isend(sub[g], cross[g]) for g in peers if sub[g].size]
                n = sub[h].size
                if n:
                    scr = self.scratch[k] = take(n * len(peers), buf.dtype)
                    reqs += [cc.irecv(scr[t * n:(t + 1) * n], cross[g])
                             for t, g in enumerate(peers)]
        elif s == 2:    # fold in the other hosts' shares, then
            if mine.size:
                self._fold(k, sub[h], len(peers))
            if root is None and mine.size:      # all-reduce: cross all-gather
                reqs = [cc.isend(sub[h], cross[g]) for g in peers if sub[h].size]
                reqs += [cc.irecv(sub[g], cross[g]) for g in peers if sub[g].size]
            elif root is not None:              # reduce: every sub-chunk to the root
                if cc.rank != root and sub[h].size:
                    reqs = [cc.isend(sub[h], root)]
                if cc.rank == root:
                    for j in range(m):
                        cj = chunk_offsets(part[j].size, nh)
                        reqs += [cc.irecv(part[j][cj[g]:cj[g + 1]], plan.hosts[g][j])
                                 for g in range(nh)
                                 if plan.hosts[g][j] != root and cj[g + 1] > cj[g]]
        elif s == 3 and root is None:   # local all-gather: my reduced slice to every local rank
            if mine.size:
                reqs = [cc.isend(mine, r) for r in self.others]
            reqs += [cc.irecv(part[q], local[q]) for q in range(m) if q != me and part[q].size]
        return reqs


def _leaders(plan: Plan, root: int) -> tuple[tuple[int, ...], int]:
    """Each host's leader with the root leading its own host; the root's index there."""
    root_host = next(h for h, g in enumerate(plan.hosts) if root in g)
    leaders = tuple(root if h == root_host else lead for h, lead in enumerate(plan.leaders))
    return leaders, root_host


def reduce_hierarchical(cc, buf: np.ndarray, root: int, op, *,
                        piece_bytes: int | None = None) -> None:
    """Two-level reduce: the all-reduce's reduce-scatter (in each host, then each slice
    across hosts), then every reduced sub-chunk straight to ``root``; pipelined in pieces.

    Args:
        cc: the collective context; ``cc.comm.host_layout`` gives the hosts.
        buf: 1-D C-contiguous array holding this rank's contribution (same count and
            dtype everywhere); used as scratch on every rank, on ``root`` the result.
        root: the rank that receives the result.
        op: a commutative :class:`pycomm.ops.Op`.
        piece_bytes: bytes per pipeline piece (default :data:`PIECE_BYTES`).
    """
    plan = plan_of(cc)
    count = buf.size
    if count == 0 or cc.size == 1:
        return
    per = PIECE_BYTES if piece_bytes is None else max(1, int(piece_bytes))
    npieces = min(count, max(1, -(-buf.nbytes // per)))
    pieces = chunk_offsets(count, npieces)
    run = _Pieces(cc, plan, buf, op, root)
    _ticks(cc, npieces, 4, lambda s, k: run.stage(s, k, pieces[k], pieces[k + 1]))


def bcast_hierarchical(cc, buf: np.ndarray, root: int) -> None:
    """Two-level broadcast: across the hosts' leaders from ``root``, then in each host.

    Args:
        cc: the collective context; ``cc.comm.host_layout`` gives the hosts.
        buf: 1-D C-contiguous array, same size and dtype on every rank; read on ``root``,
            written elsewhere.
        root: the broadcasting rank.
    """
    plan = plan_of(cc)
    leaders, root_host = _leaders(plan, root)
    lead = leaders[plan.host]
    if cc.rank == lead and len(leaders) > 1:
        fn = _inner("bcast", buf.nbytes, len(leaders), True, _net(cc))
        fn(View(cc, leaders), buf, root_host)
    local = plan.local
    if len(local) > 1:
        fn = _inner("bcast", buf.nbytes, len(local), True, DEFAULT_TRANSPORT)
        fn(View(cc, local), buf, local.index(lead))


def allgather_hierarchical(cc, buf: np.ndarray, count: int, *,
                           piece_bytes: int | None = None) -> None:
    """Two-level all-gather: every rank sends its block once to each other host, then each
    host's ranks pass on what they received; pipelined in pieces.

    Args:
        cc: the collective context; ``cc.comm.host_layout`` gives the hosts.
        buf: 1-D C-contiguous array of ``size * count`` elements; block ``rank`` (elements
            ``rank*count`` up to ``(rank+1)*count``) is this rank's on entry; on return
            block ``r`` holds rank ``r``'s.
        count: elements per rank (the same on every rank).
        piece_bytes: bytes of ``buf`` per pipeline piece (default :data:`PIECE_BYTES`).
    """
    plan = plan_of(cc)
    if count == 0 or cc.size == 1:
        return
    hosts, h, me = plan.hosts, plan.host, plan.local_rank
    local = plan.local
    # on host g, local rank i stands for the blocks of ranks (x, j), x != g, j % len == i
    mine = [cc.rank] + [r for x, group in enumerate(hosts) if x != h
                        for j, r in enumerate(group) if j % len(local) == me]
    theirs = {q: [q] + [r for x, group in enumerate(hosts) if x != h
                        for j, r in enumerate(group) if j % len(local) == i]
              for i, q in enumerate(local) if q != cc.rank}
    targets = [group[me % len(group)] for x, group in enumerate(hosts) if x != h]
    sources = [r for x, group in enumerate(hosts) if x != h
               for j, r in enumerate(group) if j % len(local) == me]
    per = PIECE_BYTES if piece_bytes is None else max(1, int(piece_bytes))
    npieces = min(count, max(1, -(-buf.nbytes // per)))
    offs = chunk_offsets(count, npieces)

    def piece(r: int, k: int) -> np.ndarray:
        return buf[r * count + offs[k]:r * count + offs[k + 1]]

    def stage(s: int, k: int) -> list:
        if s == 0:      # my block's piece to each other host; theirs from the ranks I serve
            return ([cc.isend(piece(cc.rank, k), t) for t in targets]
                    + [cc.irecv(piece(r, k), r) for r in sources])
        if s == 1:      # what I hold to every local rank; what each holds from it
            return ([cc.isend(piece(r, k), q) for q in theirs for r in mine]
                    + [cc.irecv(piece(r, k), q) for q, rs in theirs.items() for r in rs])
        return []
    _ticks(cc, npieces, 3, stage)


def _ticks(cc, npieces: int, stages: int, stage) -> None:
    """Run ``stage(s, k)`` for every stage ``s`` of every piece ``k``, stage ``s`` of piece
    ``k`` at tick ``k + s * _LAG``, oldest piece first, waiting for the requests a piece's
    previous stage returned: every rank posts in the same order, so each pair's messages
    match in order under the call's one tag."""
    pending: list = [()] * npieces
    for tick in range(npieces + (stages - 1) * _LAG):
        for s in range(stages - 1, -1, -1):
            k = tick - s * _LAG
            if 0 <= k < npieces:
                if pending[k]:
                    cc.waitall(pending[k])
                pending[k] = stage(s, k)


def barrier_hierarchical(cc) -> None:
    """Two-level barrier: fan-in to each host's leader, dissemination across the leaders,
    fan-out.

    Args:
        cc: the collective context; ``cc.comm.host_layout`` gives the hosts.
    """
    plan = plan_of(cc)
    lead = plan.leaders[plan.host]
    others = [r for r in plan.local if r != lead]
    if cc.rank != lead:
        cc.send(_EMPTY, lead)
        cc.recv(np.empty(0, dtype=np.uint8), lead)
        return
    tokens = [np.empty(0, dtype=np.uint8) for _ in others]
    cc.waitall([cc.irecv(t, r) for t, r in zip(tokens, others, strict=True)])
    if len(plan.leaders) > 1:
        barrier_dissemination(View(cc, plan.leaders))
    cc.waitall([cc.isend(_EMPTY, r) for r in others])
