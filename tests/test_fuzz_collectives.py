"""A fixed sample of the differential fuzzing campaign (tests/fuzzgen.py) on real worlds.

Each case is a seed: every rank draws the same random program of collective,
point-to-point, object and nonblocking calls (dtypes int8..uint64, float16..complex128,
bool, MAXLOC/MINLOC pairs, a non-commutative user op; counts from 0 to past the slot,
eager and direct-read thresholds; IN_PLACE, roots, forced algorithms and the automatic
choice, sub-communicators from Split with reordered keys and Create/Create_group, buffers
that are offset slices with guard bytes, several nonblocking collectives completed in a
different order on each rank), rebuilds every rank's input from the seed and checks its
own results against numpy; :func:`fuzzgen.check_case` also requires bit-identical
all-reduce results on every rank of a communicator and the same refusals everywhere.

A failure prints the command that replays the case:
``python tests/fuzzgen.py --replay SIZE TRANSPORT SEED --steps STEPS --max-bytes N``.
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest

import fuzzgen  # tests/ is on sys.path under pytest
from conftest import World

cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(fuzzgen)

# worlds of the shared matrix (no extra pool starts in a full run): every transport, odd
# sizes, a prime, a power of two
FUZZ_WORLDS = [(3, "shm"), (4, "shm"), (7, "shm"), (5, "tcp"), (3, "rdma")]
SEEDS = (11,)                     # plus the world size: each world runs its own program
STEPS = 12
MAX_BYTES = 320 * 1024           # per buffer (past 256 KiB); the MiB cases stay in the campaign


@pytest.fixture(scope="session", params=FUZZ_WORLDS, ids=lambda p: f"n{p[0]}-{p[1]}")
def world(request) -> World:
    """A few worlds of the shared matrix: every transport, odd and even sizes."""
    return World(*request.param)


def test_fuzz_sample(world):
    problems = []
    checked = 0
    for seed in (s + world.size for s in SEEDS):
        per_rank = world.run(fuzzgen.fuzz_task, seed, STEPS, None, MAX_BYTES)
        assert len(per_rank) == world.size
        for msg in fuzzgen.check_case(per_rank):
            problems.append(f"seed {seed}: {msg}\n  replay: python tests/fuzzgen.py "
                            f"--replay {world.size} {world.transport} {seed} --steps {STEPS} "
                            f"--max-bytes {MAX_BYTES}")
        checked += sum(1 for rec in per_rank[0] if rec["exc"] is None)
    assert not problems, "\n".join(problems[:10])
    # the cases ran calls, not only refusals
    assert checked >= len(SEEDS) * STEPS // 2
