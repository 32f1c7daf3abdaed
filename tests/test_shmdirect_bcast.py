"""Large broadcasts by direct copies between the ranks' buffers (on two ranks the root writes
half into its peer's; past two, reads of the root's and the peers' buffers)
(pycomm.shmdirect.direct_bcast).

* every rank ends with the root's bytes, for every root, several dtypes, counts that do
  not divide among the ranks and fewer elements than ranks, and the root's buffer is
  read-only and unchanged;
* the path is taken exactly where promised: a blocking Bcast of at least
  ``PYCOMM_SHM_DIRECT_BYTES`` (unset: 128 KiB with a core per rank) with no algorithm
  named, on a one-host shared-memory communicator; messages otherwise; and every
  collective's threshold follows pycomm.plan.DIRECT_FROM, the cores and the variable;
* a random schedule of direct, slot and message broadcasts with ranks delayed at random
  keeps every result right (no rank returns while a peer still reads its buffer);
* a peer that runs the call by its Ibcast makes every rank take messages, with the root's
  data everywhere; ranks that disagree on the root fail as a mismatch, never hang, and
  the communicator is usable after;
* (a rank whose call fails withdraws its buffer, and a descheduled peer that reads it
  after it was reused raises: test_shmdirect_withdrawal.py's test, for bcast too.)
"""

from __future__ import annotations

import sys
import time

import cloudpickle
import numpy as np
import pytest

import pycomm
from conftest import World
from test_shmdirect import _threshold
from pycomm.plan import DIRECT_FROM, direct_threshold
from pycomm.shmdirect import SHM_DIRECT

cloudpickle.register_pickle_by_value(sys.modules[__name__])

# 2 ranks: the other rank reads the head while the root writes the tail; 3 and 5: scatter
# + all-gather by reads
BCAST_WORLDS = [(2, "shm"), (3, "shm"), (5, "shm")]


@pytest.fixture(scope="session", params=BCAST_WORLDS, ids=lambda p: f"n{p[0]}-{p[1]}")
def world(request) -> World:
    return World(*request.param)


def _data(root: int, count: int, dtype) -> np.ndarray:
    """The root's buffer: distinct values per element and per root."""
    x = (np.arange(count) * 7 + 13 * root + 1) % 251
    return x.astype(dtype) if np.dtype(dtype) != np.bool_ else (x % 2).astype(bool)


def _bcast_cases(counts, dtypes):
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    bad, paths = [], set()
    with _threshold(1, slots=False):        # from 1 byte on, so tiny counts read too
        for root in range(n):
            for count in counts:
                for dtype in dtypes:
                    want = _data(root, count, dtype)
                    if r == root:
                        buf = want.copy()
                        buf.flags.writeable = False
                    else:
                        buf = np.zeros(count, dtype)
                    paths.add(comm.chosen_algorithm("bcast", buf.nbytes))
                    comm.Bcast(buf, root=root)
                    if not np.array_equal(buf, want):
                        bad.append((root, count, np.dtype(dtype).str))
    return bad, sorted(paths)


def test_every_rank_gets_the_roots_bytes(world):
    n = world.size
    counts = [1, 2, n - 1, n + 1, 1000, 4099, (1 << 16) + 3]
    dtypes = [np.float64, np.int32, np.uint8, np.complex128, np.bool_, np.float16]
    for rank, (bad, paths) in enumerate(world.run(_bcast_cases, counts, dtypes)):
        assert bad == [], (rank, bad[:5])
        assert paths == [SHM_DIRECT], (rank, paths)


def _choices():
    comm = pycomm.COMM_WORLD
    at = direct_threshold(comm, "bcast")
    out = {
        "default": comm.chosen_algorithm("bcast", at),
        "auto": comm.chosen_algorithm("bcast", at, algorithm="auto"),
        "large": comm.chosen_algorithm("bcast", 64 << 20),
        "below": comm.chosen_algorithm("bcast", at - 8),
        "named": comm.chosen_algorithm("bcast", at, algorithm="binomial"),
        "nonblocking": comm.chosen_algorithm("bcast", at, blocking=False),
    }
    with _threshold(0):
        out["off"] = comm.chosen_algorithm("bcast", at)
    return out


def test_direct_bcast_is_taken_exactly_where_promised(world):
    for took in world.run(_choices):
        assert took["default"] == took["auto"] == took["large"] == SHM_DIRECT, took
        assert took["named"] == "binomial", took
        for key in ("below", "nonblocking", "off"):     # messages
            assert took[key] not in (SHM_DIRECT, "shared_slots"), (key, took)


def _thresholds():
    comm = pycomm.COMM_WORLD
    out = {"oversubscribed": comm._selection.oversubscription() > 1.0}
    for collective in DIRECT_FROM:
        at = direct_threshold(comm, collective)
        # past the slots (which take what they hold first): direct from the threshold on
        held = pycomm.config.get("PYCOMM_SHM_COLL_BYTES") * (
            comm.size if collective == "allgather" else 1)
        past = max(at, held + 8 * comm.size)
        out[collective] = (at, comm.chosen_algorithm(collective, past),
                           comm.chosen_algorithm(collective, at - 8),
                           pycomm.plan.takes_slots(comm, collective, at - 8, None))
    with _threshold(4096):
        out["set"] = {c: direct_threshold(comm, c) for c in DIRECT_FROM}
    return out


def test_the_direct_threshold_follows_the_collective_and_the_cores(world):
    # a core per rank: each collective from where direct reads were measured to win;
    # ranks outnumbering cores: 256 KiB for all; PYCOMM_SHM_DIRECT_BYTES set: that, for all
    default = pycomm.config.VARS["PYCOMM_SHM_DIRECT_BYTES"].default
    for took in world.run(_thresholds):
        for collective, want in DIRECT_FROM.items():
            at, there, below, slots_below = took[collective]
            assert at == (default if took["oversubscribed"] else want), (collective, took)
            assert there == SHM_DIRECT, (collective, took)
            assert below == "shared_slots" if slots_below else \
                below not in (SHM_DIRECT, "shared_slots"), (collective, took)
        assert took["set"] == dict.fromkeys(DIRECT_FROM, 4096), took


def test_a_tcp_world_never_broadcasts_by_reads():
    def choice():
        return pycomm.COMM_WORLD.chosen_algorithm("bcast", 16 << 20)
    assert SHM_DIRECT not in World(3, "tcp").run(choice)


def _random_schedule(seed, rounds):
    """Slot, direct and message broadcasts mixed, from every root, each rank sleeping at
    random before it enters, buffers rewritten as soon as the call returns."""
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    rng = np.random.default_rng(seed)        # the same schedule on every rank
    mine = np.random.default_rng(seed + 97 * r)
    bad = []
    with _threshold(4096):
        for i in range(rounds):
            count = int(rng.choice([3, 700, 5000, 40000]))
            root = int(rng.integers(n))
            alg = rng.choice(["none", "none", "binomial"])
            x = np.full(count, float(root + i) if r == root else -2.0)
            if mine.random() < 0.3:
                time.sleep(mine.random() * 0.003)
            comm.Bcast(x, root=root, algorithm=None if alg == "none" else str(alg))
            if not (x == root + i).all():
                bad.append((i, count, root, str(alg), float(x.min()), float(x.max())))
            x[...] = -1.0                    # a peer still reading would see this
    return bad


def test_random_schedule_with_delays_keeps_every_result_right(world):
    for rank, bad in enumerate(world.run(_random_schedule, 5, 60)):
        assert bad == [], (rank, bad[:3])


def _against_messages():
    """One rank enters by its Ibcast: every rank takes messages. Then the ranks disagree
    on the root: a mismatch, found before anything is read, and the communicator is
    usable after."""
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    with _threshold(4096):
        x = np.full(5000, 9.0 if r == 0 else float(r))
        if r == n - 1:
            comm.Ibcast(x, root=0).Wait()
        else:
            comm.Bcast(x, root=0)
        y = np.full(5000, float(r))
        t = time.monotonic()
        try:
            comm.Bcast(y, root=0 if r == 0 else 1)
            first = "completed"
        except pycomm.CommError as exc:
            first = f"{type(exc).__name__}: {exc}"
        took = time.monotonic() - t
        after = []
        for _ in range(3):          # the call after a mismatch is abandoned too, by design
            z = np.full(5000, 5.0 if r == 0 else 0.0)
            try:
                comm.Bcast(z, root=0)
                after.append(float(z.min()))
            except pycomm.CommError as exc:
                after.append(type(exc).__name__)
    return float(x.min()), float(x.max()), first, took, after


def test_a_peer_by_ibcast_or_another_root_never_hangs(world):
    for rank, (lo, hi, first, took, after) in enumerate(world.run(_against_messages)):
        assert lo == hi == 9.0, rank
        assert first.startswith("Collective"), (rank, first)
        assert took < 10.0, (rank, took)                 # no rank waited for a timeout
        assert after[-1] == 5.0, (rank, after)           # usable again
