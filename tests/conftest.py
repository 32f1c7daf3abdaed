"""Shared worlds for the multi-process tests: one persistent pycomm.Pool per (size, transport).

Starting N rank processes and connecting them costs about a second, so the tests that need
a world share one :class:`pycomm.Pool` per (size, transport) for the whole session:

* ``world``: sizes {1, 2, 3, 4, 5, 7, 8} on shm, {2, 3, 5, 8} on tcp, plus sizes
  {2, 3} on the emulated rdma transport, for the cheap tests. The sizes are the
  schedules' business (the same engine code above every transport, and every algorithm
  also runs at sizes 1..9 on fake ranks): shm takes the full list, tcp the reduced one
  (the smallest pair, an odd size, a prime, the largest power of two);
* ``world_small``: sizes {1, 2, 3, 5, 8} on shm and {2, 3, 5, 8} on tcp, for the
  expensive ones (one rank, the smallest pair, an odd size, a prime, the largest power of
  two), and 6 and 9 ranks on shm, so that the real processes cover every size 1..9;

A world of one rank is on shm only: with one rank the bootstrap starts no store and no
transport whatever was asked (launch/bootstrap.py: ``if je.size > 1``; its
``transport_name`` is "self"), self-sends are delivered in p2p.py, and every collective
returns at size 1, so a 1-rank "tcp" world ran exactly the code of the 1-rank shm one.
* ``world_tiny``: sizes {3, 4} x {shm, tcp} with a 64-byte eager limit, 24-byte segments
  and 4 KiB shared-memory rings, so that small inputs already take the rendezvous,
  multi-segment and ring wrap-around paths (Gloo's trick of a tiny maximum segment).

Both fixtures are session-scoped and parametrized; items are then sorted so that every
test of one world runs back to back, whichever fixture it asked for, and the cache below
keeps only ONE pool alive: asking for another world closes the previous one. A pool that
a test broke (a dead rank, an overrun task) is replaced for the next test.

A test ships a function to the ranks with ``world.run(fn, *args)`` and gets the list of
per-rank return values; a rank's exception comes back as :class:`pycomm.RemoteError`
carrying its traceback. Test modules that ship functions call
``cloudpickle.register_pickle_by_value(sys.modules[__name__])`` so that their functions
travel by value (the ranks then never import the test module, pytest or hypothesis).
``World.run`` pickles a module-level function once per session and ships those bytes with
each task (cloudpickle takes about 2 ms per task to pickle a test module's function by
value again); lambdas and nested functions, whose captured values may differ from call to
call, are pickled per task as before.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import types

import cloudpickle
import pytest

import pycomm
from pycomm.errors import add_note

SIZES = (1, 2, 3, 4, 5, 7, 8)
SMALL_SIZES = (1, 2, 3, 5, 8)
TRANSPORTS = ("shm", "tcp")
# one rank runs no transport (module docstring): tcp starts at 2
TCP_SIZES = tuple(n for n in SMALL_SIZES if n > 1)
# The emulated-RDMA transport runs the same conformance tests on two world sizes (its NIC
# threads make every world slower to start and to drive).
RDMA_WORLDS = [(2, "rdma"), (3, "rdma")]
WORLDS = ([(n, "shm") for n in SIZES] + [(n, "tcp") for n in TCP_SIZES]
          + RDMA_WORLDS)
# 6 and 9 ranks (shm only) complete 1..9 on real processes for the reduced matrix
SMALL_WORLDS = ([(n, "shm") for n in SMALL_SIZES] + [(n, "tcp") for n in TCP_SIZES]
                + [(6, "shm"), (9, "shm")])
TINY_WORLDS = [(n, t, "tiny") for t in TRANSPORTS for n in (3, 4)]
TINY_ENV = {"PYCOMM_EAGER_LIMIT": "64", "PYCOMM_SEGMENT_BYTES": "24",
            "PYCOMM_RING_SEGMENT_BYTES": "24", "PYCOMM_HALVING_SEGMENT_BYTES": "24",
            "PYCOMM_SHM_RING_BYTES": "4096"}
VARIANT_ENV = {"": {}, "tiny": TINY_ENV}
# Seconds one task may take (also PYCOMM_TIMEOUT of the ranks): a deadlock fails the test
# well before pytest-timeout kills the whole session.
WORLD_TIMEOUT = 120.0
# Seconds one batch of cases (World.run_case) may take: below pytest-timeout's 300 s for
# the test that runs it.
BATCH_TIMEOUT = 240.0


def _world_id(param: tuple) -> str:
    return "-".join([f"n{param[0]}", *param[1:]])


def _noop() -> None:
    return None


def _run_cases(fn, cases: list) -> dict:
    """On a rank: ``fn(*args)`` for every ``(key, args)`` of ``cases`` in order; the results
    by key. A case that raises stops the task (its key is added to the exception)."""
    out = {}
    for key, args in cases:
        try:
            out[key] = fn(*args)
        except BaseException as exc:
            add_note(exc, f"(in the case {key!r} of a batch: World.run_case)")
            raise
    return out


class _PoolCache:
    """Holds at most one live Pool; asking for another (size, transport) closes it."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.pool: pycomm.Pool | None = None

    def get(self, size: int, transport: str, variant: str = "") -> pycomm.Pool:
        key = (size, transport, variant)
        if self.pool is not None and self.key != key:
            self.close()
        if self.pool is None:
            with _environment(VARIANT_ENV[variant]):    # the ranks inherit it at start
                self.pool = pycomm.Pool(size, transport=transport, timeout=WORLD_TIMEOUT)
            self.key = key
        return self.pool

    def check(self) -> None:
        """After a failed task: drop the pool unless it still answers."""
        if self.pool is None:
            return
        try:
            self.pool.run(_noop, timeout=10.0)
        except pycomm.CommError:
            self.close()

    def close(self) -> None:
        pool, self.pool, self.key = self.pool, None, None
        if pool is not None:
            pool.close()


def _share_bytecode() -> str | None:
    """Let the processes the tests start share compiled bytecode; return its folder.

    With ``PYTHONDONTWRITEBYTECODE`` set (as in this VM's environment) and no
    ``__pycache__`` in the checkout, every process the suite starts (each rank of each
    world, each launched job's launcher and ranks: well over a thousand) compiled pycomm's
    modules from source again, about 0.13 s of CPU per process on the 2-core VM (a pool of
    4 ranks started 3 times: 5.9 -> 4.4 s of CPU). The children get instead a bytecode
    cache of their own in a temporary folder (``PYTHONPYCACHEPREFIX``, removed when pytest
    exits), which the first of them fills: the checkout itself still gets no
    ``__pycache__``, and the code that runs is the same."""
    if "PYTHONDONTWRITEBYTECODE" not in os.environ or "PYTHONPYCACHEPREFIX" in os.environ:
        return None
    folder = tempfile.mkdtemp(prefix="pycomm-tests-pyc-")
    atexit.register(shutil.rmtree, folder, True)
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = folder
    return folder


_share_bytecode()

# tests/data holds programs the tests run (mpi4py's demos: test_*.py that import mpi4py and
# call MPI at import), not pytest modules
collect_ignore = ["data"]

_CACHE = _PoolCache()
# World.run_case: (size, transport, variant, fn, id(cases)) -> (cases, mapping, per-rank
# results or None where the batch failed)
_BATCHES: dict = {}


# conftest's own helpers (_Shipped) travel by value: the ranks cannot import it
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class _Shipped:
    """``fn`` pickled once; calling this unpickles and calls it (on the ranks).

    ``__qualname__`` is the function's, so that a task's timeout still names it."""

    def __init__(self, fn) -> None:
        self.blob = cloudpickle.dumps(fn)
        self.__qualname__ = fn.__qualname__

    def __call__(self, *args):
        return pickle.loads(self.blob)(*args)


_SHIPPED: dict = {}


def _shipped(fn):
    """The pickled-once form of a module-level function; anything else as it is."""
    if not isinstance(fn, types.FunctionType) or fn.__closure__ is not None \
            or fn.__qualname__ != fn.__name__ or "<" in fn.__name__:
        return fn
    if fn not in _SHIPPED:
        _SHIPPED[fn] = _Shipped(fn)
    return _SHIPPED[fn]


class World:
    """A handle on the shared pool of one (size, transport); the pool is made on demand."""

    def __init__(self, size: int, transport: str, variant: str = ""):
        self.size = size
        self.transport = transport
        self.variant = variant
        self.env = VARIANT_ENV[variant]

    def __repr__(self) -> str:
        extra = f", variant={self.variant!r}" if self.variant else ""
        return f"World(size={self.size}, transport={self.transport!r}{extra})"

    @property
    def pool(self) -> pycomm.Pool:
        return _CACHE.get(self.size, self.transport, self.variant)

    def run(self, fn, *args, timeout: float | None = None) -> list:
        """Run ``fn(*args)`` on every rank; return the per-rank results in rank order."""
        pool = self.pool
        try:
            return pool.run(_shipped(fn), *args, timeout=timeout)
        except pycomm.CommError:
            _CACHE.check()
            raise

    def run_case(self, fn, cases, key) -> list:
        """``self.run(fn, *args)`` for the case ``key`` of ``cases``, the same per-rank
        results, from one task per world that runs every case.

        ``cases`` is a module-level function ``world -> {key: args}``, the keys in the order
        the tests run. The first test of a world that asks runs every case of the mapping
        in one task, in that order, and keeps the results; later tests take theirs: one
        round trip to the ranks per world instead of one per case. Only for cases that do
        not need the task boundary between them (every rank done with one case before any
        starts the next): collectives, or p2p without wildcards.

        If the batch fails (a case raises on a rank, the task fails), every case runs alone
        (``self.run``), so that each test reports its own failure as without the batch."""
        bkey = (self.size, self.transport, self.variant, fn, id(cases))
        if bkey not in _BATCHES:
            table = cases(self)
            try:
                per_rank = self.run(_run_cases, fn, list(table.items()),
                                    timeout=BATCH_TIMEOUT)
            except pycomm.CommError:    # RemoteError included: the cases run one by one
                per_rank = None
            _BATCHES[bkey] = (cases, table, per_rank)     # cases kept alive: id() unique
        _, table, per_rank = _BATCHES[bkey]
        if per_rank is None:
            return self.run(fn, *table[key])
        return [results[key] for results in per_rank]


@pytest.fixture(scope="session", params=WORLDS, ids=_world_id)
def world(request) -> World:
    """Every world size on shm, the reduced sizes on tcp, two on rdma (module docstring)."""
    return World(*request.param)


@pytest.fixture(scope="session", params=SMALL_WORLDS, ids=_world_id)
def world_small(request) -> World:
    """The reduced matrix for expensive tests: sizes {1, 2, 3, 5, 8} on shm, {2, 3, 5, 8}
    on tcp (one rank runs no transport), 6 and 9 on shm."""
    return World(*request.param)


@pytest.fixture(scope="session", params=TINY_WORLDS, ids=_world_id)
def world_tiny(request) -> World:
    """Sizes {3, 4} x {shm, tcp} with tiny eager limit, segments and rings (see above)."""
    return World(*request.param)


@pytest.fixture
def no_shared_world():
    """Close the shared pool first, for tests that start their own ranks."""
    _CACHE.close()


_ORDER = WORLDS + [w for w in SMALL_WORLDS if w not in WORLDS] + TINY_WORLDS

# Test files that make emulated hosts (network namespaces and a bridge named by one prefix,
# each removed by name when the next cluster starts) or a Ray cluster: never two at once,
# so one xdist worker runs them all, one after another (see pytest_itemcollected).
_HOST_FILES = frozenset({
    "test_cluster.py", "test_cluster_failures.py", "test_cluster_hier.py",
    "test_hydra_hosts.py", "test_ompi_hosts.py", "test_ompi5_hosts.py", "test_ray.py",
    "test_ray_hosts.py", "test_slurm.py"})


# -- the rendezvous store's tests (test_store.py, test_store_auth.py) -------------------
STORE_TOKEN = secrets.token_hex(32)


@pytest.fixture
def server():
    """A rendezvous store (pycomm.launch.store) of STORE_TOKEN, ended after the test."""
    from pycomm.launch.store import StoreServer
    with StoreServer(STORE_TOKEN) as srv:
        yield srv


@pytest.fixture
def client(server):
    """A client of ``server``'s store, closed after the test."""
    from pycomm.launch.store_client import StoreClient
    with StoreClient(server.host, server.port, STORE_TOKEN, timeout=5.0) as cli:
        yield cli


def _world_of(item) -> tuple | None:
    """The world parameter of ``item`` (a shared world's or a module's own), or None."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        for name in ("world", "world_small", "world_tiny"):
            if name in callspec.params:
                return tuple(callspec.params[name])
    return None


def _place(item) -> tuple[tuple, str]:
    """Where ``item`` runs: its sort key (the emulated hosts first, then the other tests
    without a shared world, then one block per world; :class:`_WorldOrder`) and its xdist
    group (:func:`pytest_itemcollected`)."""
    name = os.path.basename(item.path)
    if name in _HOST_FILES:
        return (0, ()), "emulated-hosts"
    param = _world_of(item)
    if param is None:
        return (1, ()), name            # with its file: its module's fixtures made once
    if param in _ORDER:
        return (2 + _ORDER.index(param), ()), "world-" + _world_id(param)
    # a world of a module's own fixture (test_integrity.py): after the shared ones, still
    # one block per world
    return (2 + len(_ORDER), tuple(map(str, param))), f"{name}-{_world_id(param)}"


def pytest_itemcollected(item) -> None:
    # Under xdist (pyproject's addopts: three workers, --dist loadgroup), a worker takes one
    # group at a time and runs its tests in the order _WorldOrder sorts them: every test of
    # one world in one group (its pool started by one worker, once), every other test with
    # its file, the emulated hosts together (they share names). The groups are handed out
    # in that order, the longest (the hosts, about a quarter of the suite) first. The mark
    # is made as each item is collected, before any collection_modifyitems hook: xdist
    # reads it in its own (tests/test_suite_groups.py checks that the groups hold).
    if item.config.pluginmanager.hasplugin("xdist"):
        item.add_marker(pytest.mark.xdist_group(_place(item)[1]))


class _WorldOrder:
    """Sorts the items by :func:`_place` after every other plugin's reordering (pytest's
    own by fixture included), so that each pool is started once even though two fixtures
    share it."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items) -> None:
        items.sort(key=lambda item: _place(item)[0])


def pytest_configure(config) -> None:
    config.pluginmanager.register(_WorldOrder(), "pycomm-world-order")


@contextlib.contextmanager
def _environment(env: dict):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def pytest_sessionfinish(session) -> None:
    _CACHE.close()


def run_at_once(jobs: dict, folder, timeout: float = 120.0) -> dict:
    """Start every job of ``jobs`` (key -> ``(argv, options)``, ``options`` for
    :class:`subprocess.Popen`: ``cwd``, ``env``) at the same time and wait for all; return
    key -> ``(CompletedProcess with text stdout and stderr, seconds the job took)``.

    For tests whose launched jobs spend their time waiting (a timeout, a sleeping rank):
    run one after another they cost the sum of those waits, together about the longest.
    Output goes to files under ``folder`` (no pipe to fill); a job still running after
    ``timeout`` seconds is killed and reported with return code None."""
    started = {}
    for i, (key, (argv, options)) in enumerate(jobs.items()):
        out, err = (open(os.path.join(folder, f"job{i}.{k}"), "w") for k in ("out", "err"))
        with out, err:
            started[key] = (subprocess.Popen(argv, stdout=out, stderr=err, text=True,
                                             **options), time.monotonic(), i)
    took: dict = {}
    deadline = time.monotonic() + timeout
    try:
        while len(took) < len(started) and time.monotonic() < deadline:
            for key, (proc, start, _) in started.items():
                if key not in took and proc.poll() is not None:
                    took[key] = time.monotonic() - start
            time.sleep(0.02)
    finally:
        for proc, _, _ in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    done = {}
    for key, (proc, start, i) in started.items():
        text = [open(os.path.join(folder, f"job{i}.{k}")).read() for k in ("out", "err")]
        code = proc.returncode if key in took else None
        done[key] = (subprocess.CompletedProcess(proc.args, code, *text),
                     took.get(key, time.monotonic() - start))
    return done
