"""Every environment variable pycomm reads, declared once.

Each variable has a name (all prefixed ``PYCOMM_``), a type, a default and one line of
documentation. Code reads them only through :func:`get` so that the list below is the
whole truth; ``python -m pycomm.config`` prints it.

The launcher contract (what ``launch.py`` / :func:`pycomm.spawn` set for each rank):
``PYCOMM_RANK``, ``PYCOMM_WORLD_SIZE``, ``PYCOMM_LOCAL_RANK``, ``PYCOMM_LOCAL_SIZE``,
``PYCOMM_MASTER_ADDR``, ``PYCOMM_MASTER_PORT``, ``PYCOMM_JOB_TOKEN``, ``PYCOMM_JOB_ID``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["TRANSPORTS", "VARS", "Var", "algorithm_override", "describe", "explicit", "get",
           "port_range", "reload"]


@dataclass(frozen=True)
class Var:
    """One environment variable: its name, parser, default and a line of doc."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str


def _bool(text: str) -> bool:
    return text.strip().lower() not in ("", "0", "false", "no", "off")


def port_range(text: str) -> tuple[int, int]:
    """Parse ``"lo-hi"`` (or one port ``"p"``) into (lo, hi), 1 <= lo <= hi <= 65535.

    Raises:
        ValueError: not two integers joined by '-', out of 1..65535, or lo > hi.
    """
    lo_text, sep, hi_text = text.strip().partition("-")
    try:
        lo = int(lo_text)
        hi = int(hi_text) if sep else lo
    except ValueError:
        raise ValueError("expected LO-HI, two port numbers such as 29500-29599") from None
    if not 1 <= lo <= hi <= 65535:
        raise ValueError(f"ports {lo}-{hi}: need 1 <= LO <= HI <= 65535")
    return lo, hi


_DECLARED = [
    # -- launcher contract -------------------------------------------------------------
    Var("PYCOMM_RANK", int, None, "This process's rank in the world (set by the launcher)."),
    Var("PYCOMM_WORLD_SIZE", int, None, "Number of ranks in the world (set by the launcher)."),
    Var("PYCOMM_LOCAL_RANK", int, None, "Rank among the processes of this host."),
    Var("PYCOMM_LOCAL_SIZE", int, None, "Number of ranks on this host."),
    Var("PYCOMM_MASTER_ADDR", str, None, "Host of the rendezvous store."),
    Var("PYCOMM_MASTER_PORT", int, None, "TCP port of the rendezvous store."),
    Var("PYCOMM_JOB_TOKEN", str, None,
        "Per-job secret (hex); authenticates the store and every TCP connection."),
    Var("PYCOMM_JOB_ID", str, None,
        "Job identifier; names the job's /dev/shm segments so the launcher can sweep them."),
    Var("PYCOMM_LAUNCHER_PID", int, None, "PID of the supervising launcher, if any."),
    Var("PYCOMM_SPAWN_PARENTS", int, None,
        "Set in a process that MPI_Comm_spawn started (pycomm.MPI.spawn): how many of the "
        "world's first ranks are its parents."),
    Var("PYCOMM_APPNUM", int, None,
        "Set in a spawned process: the index of its command in MPI_Comm_spawn_multiple."),
    # -- behaviour -----------------------------------------------------------------------
    Var("PYCOMM_TRANSPORT", str, "auto",
        "Transport to use: auto (shm inside a host, tcp there where its /dev/shm cannot "
        "hold the job or be written; tcp across hosts), shm, tcp or rdma (emulated)."),
    Var("PYCOMM_TIMEOUT", float, 300.0,
        "Seconds any blocking operation may wait before raising TimeoutError."),
    Var("PYCOMM_HOST", str, None,
        "Address the TCP and rdma transports listen on and publish (default: loopback for a "
        "store on loopback, else the address of the interface that routes to the store)."),
    Var("PYCOMM_PEER_TIMEOUT", float, 10.0,
        "Seconds after which a TCP peer that stops answering (a pulled cable, a frozen host) "
        "is lost: keepalive probes and TCP_USER_TIMEOUT; and after which a peer on another "
        "host whose process is stopped is reported (by its process watch, "
        "transports/procwatch.py); 0 leaves the kernel's defaults and starts no watch."),
    Var("PYCOMM_PORT_RANGE", port_range, None,
        "LO-HI: every listening port of the TCP transport is taken from this range (for "
        "firewalled clusters): one per rank, two in a job across hosts (its connections' "
        "and its process watch's, with PYCOMM_PEER_TIMEOUT); default: any free port."),
    Var("PYCOMM_EAGER_LIMIT", int, 65536,
        "Messages up to this many payload bytes go eagerly; larger ones use rendezvous."),
    Var("PYCOMM_SHM_RING_BYTES", int, 1 << 20,
        "Bytes of each shared-memory ring (one per ordered pair of ranks on a host); each "
        "rank reserves its inbound rings in /dev/shm at start-up. Unset: 1 MiB, or less "
        "(down to 64 KiB) where the rings would fill more than half of /dev/shm."),
    Var("PYCOMM_SHM_COLL_BYTES", int, 64 << 10,
        "Collectives of one host's ranks with at most this many bytes per rank go through "
        "shared-memory slots instead of messages (pycomm.shmcoll); 0 turns them off. Each "
        "rank's segment has 128 slots of this size, two per communicator, reserved in /dev/shm "
        "when the communicator's first collective sets them up."),
    Var("PYCOMM_SHM_DIRECT_BYTES", int, 256 << 10,
        "A blocking all-reduce or reduce-scatter-block (with a commutative numpy op), "
        "all-gather (up to 1 MiB) or broadcast of one host's ranks, of at least this many "
        "bytes in all, reads the peers' buffers directly by cross-memory attach "
        "(pycomm.shmdirect) instead of sending messages; 0 turns it off (so does "
        "PYCOMM_SHM_COLL_BYTES=0 at start-up: the ranks publish their buffers' addresses "
        "in the slots' area). Unset: 256 KiB where ranks outnumber cores, else per "
        "collective (pycomm.plan.DIRECT_FROM: reduce-scatter-block from 16 KiB, broadcast "
        "from 128 KiB, all-reduce and all-gather from 256 KiB); a call that fits the "
        "slots (PYCOMM_SHM_COLL_BYTES a rank) takes them first."),
    Var("PYCOMM_SPIN_US", float, None,
        "Microseconds a waiting rank spins before it blocks in the kernel (default: 50, or 5 "
        "when ranks outnumber cores)."),
    Var("PYCOMM_YIELD_US", float, None,
        "Microseconds a waiting rank, once its spin is over, keeps polling with sched_yield "
        "before it sleeps in the kernel (default: 0, or 300 when ranks outnumber cores)."),
    Var("PYCOMM_CMA", _bool, True,
        "Use Linux cross-memory attach (process_vm_readv) for single-copy large messages."),
    Var("PYCOMM_MPI4PY", _bool, False,
        "Make 'import mpi4py' give pycomm.MPI (set by launch.py --mpi4py; under torchrun, "
        "srun or mpiexec it acts through pycomm-mpi4py.pth: python -m pycomm.MPI.hook)."),
    Var("PYCOMM_DEBUG", _bool, False, "Log each collective's chosen algorithm to stderr."),
    Var("PYCOMM_TRACE_CALLS", int, 256,
        "Calls each rank's flight recorder keeps (printed on errors and SIGUSR1)."),
    Var("PYCOMM_TRACE", str, None,
        "Path: at exit each rank prints its flight recorder and writes PATH.rank<k>.json, "
        "a Chrome-trace timeline of every call; launch.py merges them into PATH."),
    Var("PYCOMM_STALL_WARN", float, 30.0,
        "Seconds a wait may last before the rank warns and asks the others where they are "
        "(must be below PYCOMM_TIMEOUT to take effect)."),
    # -- launcher and rendezvous store ---------------------------------------------------
    Var("PYCOMM_FORK_SERVER", int, 1,
        "1: launch.py, its node agents, pycomm.Pool/spawn and MPI.Comm.Spawn fork the "
        "processes of a Python program from a server that has imported numpy and pycomm "
        "(pycomm.launch.forkserver); 0: each is a new interpreter."),
    Var("PYCOMM_KILL_GRACE", float, 3.0,
        "Seconds the launcher waits after SIGTERM before it SIGKILLs the remaining ranks."),
    Var("PYCOMM_REPORT_GRACE", float, 2.0,
        "Seconds the launcher gives the surviving ranks to report (and exit) after one "
        "failed, before it stops them."),
    Var("PYCOMM_STORE_MAX_BYTES", int, 1 << 28,
        "Largest message the rendezvous store accepts; bigger ones drop the connection."),
    Var("PYCOMM_SEGMENT_BYTES", int, 0,
        "Bytes per segment of pipelined collectives (bcast pipeline, allreduce "
        "double_binary_tree); 0: the pipeline's segment is the cost model's best for each "
        "call's size and the tree's 64 KiB; must be the same on every rank."),
    Var("PYCOMM_RING_SEGMENT_BYTES", int, 1 << 20,
        "Bytes per segment of the ring all-reduce's chunks: a segment is forwarded as soon "
        "as it is reduced, and scratch is two segments; must be the same on every rank."),
    Var("PYCOMM_HALVING_SEGMENT_BYTES", int, 1 << 20,
        "Bytes per segment of the recursive-halving exchanges and the fold (allreduce and "
        "reduce rabenseifner, reduce_scatter recursive_halving): a segment is reduced as "
        "soon as it arrives, and scratch is two segments; must be the same on every rank."),
    Var("PYCOMM_SCRATCH_KEEP_BYTES", int, 1 << 28,
        "Bytes of collective scratch buffers (1 MiB and larger) kept for reuse between calls "
        "(0: allocate afresh every call)."),
    Var("PYCOMM_TUNE_FILE", str, None,
        "JSON table of cost-model constants written by python -m pycomm.tuning.tune (default: the "
        "table shipped in pycomm/tuning/tuned.json)."),
]

VARS: dict[str, Var] = {v.name: v for v in _DECLARED}
TRANSPORTS = ("auto", "shm", "tcp", "rdma")     # the values of PYCOMM_TRANSPORT

# Per-collective algorithm overrides, PYCOMM_ALGORITHM_<COLLECTIVE> (e.g. ..._ALLREDUCE).
ALGORITHM_PREFIX = "PYCOMM_ALGORITHM_"


# Bumped by reload(): communicators compare it with the generation their plans were made
# in (pycomm.plan), so that no call re-reads the environment.
generation = 0


def reload() -> None:
    """Make every communicator read the configuration again.

    Each communicator reads the variables that shape a collective call (the algorithm
    overrides, segment sizes, the eager limit, the tuning file) once, when it first runs
    a call of that shape (:mod:`pycomm.plan`); call this after changing any of them at run
    time. Sends nothing; takes effect at each communicator's next collective.
    """
    global generation
    generation += 1


def get(name: str, environ: dict[str, str] | None = None) -> Any:
    """Return the parsed value of declared variable ``name`` (its default when unset).

    Raises:
        KeyError: ``name`` is not declared in this module.
        ValueError: the variable is set but cannot be parsed; the message names it.
    """
    var = VARS[name]
    env = os.environ if environ is None else environ
    text = env.get(name)
    if text is None or text == "":
        return var.default
    try:
        return var.parse(text)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={text!r} is invalid: {exc}") from None


def explicit(name: str, environ: dict[str, str] | None = None) -> Any:
    """Return the parsed value of declared variable ``name`` where it is set, else None
    (for a default that depends on more than the variable: see :func:`get`'s errors)."""
    env = os.environ if environ is None else environ
    if env.get(name) in (None, ""):
        return None
    return get(name, env)


def algorithm_override(collective: str, environ: dict[str, str] | None = None) -> str | None:
    """Return ``PYCOMM_ALGORITHM_<COLLECTIVE>`` (collective upper-cased), or None when unset."""
    env = os.environ if environ is None else environ
    value = env.get(ALGORITHM_PREFIX + collective.upper())
    return value.strip() or None if value is not None else None


def describe() -> str:
    """Return a table of every declared variable, its default and its doc line."""
    lines = [f"{v.name:24} default={v.default!r:10} {v.doc}" for v in _DECLARED]
    lines.append(f"{ALGORITHM_PREFIX + '<COLL>':24} default=None       "
                 "Force the algorithm of one collective, e.g. PYCOMM_ALGORITHM_ALLREDUCE=ring.")
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe())
