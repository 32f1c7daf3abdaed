"""Wire costs as the algorithms' docstrings state them: messages (and bytes) each rank
sends, counted on fake ranks (threads, :mod:`fakecomm`), with every pipelined schedule's
segment forced to 24 bytes so that the segment counts show.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import pycomm.collectives.flat as algs       # the flat schedules, by function name
from pycomm import ops
from pycomm import topology
from fakecomm import run_fake  # tests/ is on sys.path under pytest

SIZES = list(range(1, 10))
SEGMENT_BYTES = 24


@pytest.fixture(autouse=True)
def _small_segments(monkeypatch):
    for var in ("PYCOMM_SEGMENT_BYTES", "PYCOMM_RING_SEGMENT_BYTES",
                "PYCOMM_HALVING_SEGMENT_BYTES"):
        monkeypatch.setenv(var, str(SEGMENT_BYTES))


@pytest.mark.parametrize("size", SIZES)
def test_message_counts(size):
    count = 37
    q, lg = topology.pof2_floor(size), topology.ceil_log2(size)
    folded = [topology.fold_new_rank(r, size) is None for r in range(size)]
    in_fold = [r < 2 * (size - q) for r in range(size)]

    def traffic(fn):
        _, ccs = run_fake(size, fn, return_ccs=True)
        return [cc.sent_messages for cc in ccs], [cc.sent_bytes for cc in ccs]

    msgs, nbytes = traffic(lambda cc: algs.barrier_dissemination(cc))
    assert msgs == [lg] * size and nbytes == [0] * size
    msgs, _ = traffic(lambda cc: algs.bcast_binomial(cc, np.zeros(count), 0))
    assert sum(msgs) == size - 1
    # ring: rank r forwards every chunk but r+1 in the reduce-scatter and every chunk but
    # r+2 in the all-gather, each chunk as ceil(bytes / segment) messages
    offs = topology.chunk_offsets(count, size)
    chunk_segs = [-(-(offs[c + 1] - offs[c]) * 8 // SEGMENT_BYTES) for c in range(size)]
    msgs, nbytes = traffic(lambda cc: algs.allreduce_ring(cc, np.ones(count), ops.SUM))
    assert msgs == [0 if size == 1 else 2 * sum(chunk_segs) - chunk_segs[(r + 1) % size]
                    - chunk_segs[(r + 2) % size] for r in range(size)]
    assert all(b <= 2 * 8 * (count * (size - 1) // size + 2) for b in nbytes)
    # rabenseifner: the fold and each halving exchange go as segments
    # (PYCOMM_HALVING_SEGMENT_BYTES); the last one echoes each reduced segment back (the
    # all-gather's first step), the rest of the all-gather is one message per step
    def nsegs(elements):
        return -(-elements * 8 // SEGMENT_BYTES)

    logq = q.bit_length() - 1
    qoffs = topology.chunk_offsets(count, q)
    expected = []
    for r in range(size):
        new = topology.fold_new_rank(r, size)
        if new is None:
            expected.append(nsegs(count))
            continue
        lo, hi, sent, mask = 0, q, 0, 1
        while mask < q:
            mid = (lo + hi) // 2
            give_, keep = ((mid, hi), (lo, mid)) if new < new ^ mask else ((lo, mid), (mid, hi))
            sent += nsegs(qoffs[give_[1]] - qoffs[give_[0]])
            lo, hi = keep
            mask <<= 1
        echo = nsegs(qoffs[hi] - qoffs[lo]) if logq else 0
        expected.append(sent + max(0, logq - 1) + echo + in_fold[r])
    msgs, _ = traffic(lambda cc: algs.allreduce_rabenseifner(cc, np.ones(count), ops.SUM))
    assert msgs == expected
    msgs, _ = traffic(lambda cc: algs.allreduce_recursive_doubling(cc, np.ones(count), ops.SUM))
    assert msgs == [nsegs(count) if f else logq + i for f, i in zip(folded, in_fold, strict=True)]
    msgs, nbytes = traffic(lambda cc: algs.barrier_binomial(cc))
    assert sum(msgs) == 2 * (size - 1) and max(msgs) <= lg + 1 and sum(nbytes) == 0
    segments = -(-count * 8 // SEGMENT_BYTES)
    for root in range(size):
        msgs, nbytes = traffic(lambda cc: algs.bcast_pipeline(cc, np.zeros(count), root))
        assert sum(msgs) == (size - 1) * segments and sum(nbytes) == (size - 1) * count * 8
        assert msgs[(root - 1) % size] == 0 or size == 1  # the chain ends before the root
    msgs, _ = traffic(lambda cc: algs.allgather_bruck(cc, np.zeros(size * count), count))
    assert msgs == [lg] * size
    msgs, nbytes = traffic(lambda cc: algs.alltoall_bruck(
        cc, np.zeros(size * count), np.zeros(size * count), count))
    assert msgs == [lg] * size and all(b <= lg * (size + 1) // 2 * count * 8 for b in nbytes)
    # double binary tree: each non-root sends every segment of its tree's half up once,
    # every rank sends each segment down to each child once
    half = [(count + 1) // 2, count // 2]
    segs = [-(-h * 8 // SEGMENT_BYTES) for h in half]
    expected = []
    for r in range(size):
        trees = topology.double_binary_tree(r, size)
        expected.append(sum(segs[t] * ((parent is not None) + len(children))
                            for t, (parent, children) in enumerate(trees)) if size > 1 else 0)
    msgs, _ = traffic(lambda cc: algs.allreduce_double_binary_tree(cc, np.ones(count), ops.SUM))
    assert msgs == expected


@pytest.mark.parametrize("size", [2, 3, 4, 5])
def test_pipeline_bcast_with_the_models_segment(size, monkeypatch):
    # PYCOMM_SEGMENT_BYTES=0: with no segment passed, the chain cuts the vector at the
    # model's segment for its size (shm constants, a core per rank); every rank but the
    # last forwards ceil(n / segment) messages, and every rank ends with the root's data
    monkeypatch.setenv("PYCOMM_SEGMENT_BYTES", "0")
    cost = importlib.import_module("pycomm.tuning.cost")
    count, root = (3 << 20) + 5, size - 1          # float64: 24 MiB and 40 bytes
    seg = cost.segment_bytes("bcast", "pipeline", count * 8, size)
    assert (seg < count * 8) == (size > 2)   # on 2 ranks one message is best
    want = np.arange(count, dtype=np.float64)

    def fn(cc):
        buf = want.copy() if cc.rank == root else np.full(count, -1.0)
        algs.bcast_pipeline(cc, buf, root)
        return bool(np.array_equal(buf, want))

    ok, ccs = run_fake(size, fn, return_ccs=True, timeout=60.0)
    assert all(ok)
    nseg = -(-count // (seg // 8))
    last = (root - 1) % size
    assert [cc.sent_messages for cc in ccs] == [0 if r == last else nseg for r in range(size)]


def test_default_segments(monkeypatch):
    # PYCOMM_SEGMENT_BYTES unset or 0: the double binary tree keeps its 64 KiB segments
    # (a 0 once reached it as 1-element segments: a 2 MiB all-reduce ran for seconds)
    bcast = importlib.import_module("pycomm.collectives.bcast")
    for value in (None, "0", "-4096"):  # a negative one is "automatic" to the model too
        if value is None:
            monkeypatch.delenv("PYCOMM_SEGMENT_BYTES", raising=False)
        else:
            monkeypatch.setenv("PYCOMM_SEGMENT_BYTES", value)
        assert bcast.segment_elements(8) == 65536 // 8
        assert bcast.segment_elements(4, 4096) == 1024
    monkeypatch.setenv("PYCOMM_SEGMENT_BYTES", "96")
    assert bcast.segment_elements(8) == 12
