"""A collective call's plan, decided once per communicator: signature, algorithm, function.

A call's signature (:mod:`pycomm.signature`), its op's check against the dtype and the
choice of algorithm (:meth:`pycomm.tuning.selection.AlgorithmSelection.choose`, which reads the
configuration) depend only on the call's shape: the collective, dtype, element count,
root, op and ``algorithm=``. Small messages repeat the same shapes call after call, so
each communicator keeps the plan of every shape it has run (up to :data:`MAX_PLANS`) and
a repeated call costs one dictionary lookup (the small-message fast path of issue 17;
NCCL and MPICH likewise decide once per communicator and message size class).

The configuration is read when a plan is made: after changing ``PYCOMM_ALGORITHM_*``,
segment sizes, ``PYCOMM_EAGER_LIMIT`` or ``PYCOMM_TUNE_FILE`` at run time, call
:func:`pycomm.config.reload` so that every communicator makes its plans again. Plans are
kept only once a communicator's model inputs are final (its ``transport_name`` is set:
the world's start-up collectives run before the ranks have agreed on them).

A plan also says whether the call may skip the message layer: through shared-memory
slots (:mod:`pycomm.shmcoll`) on a communicator of one host's ranks, for the seven
collectives that module serves, when each rank's data fits a slot; or, for an all-reduce,
reduce-scatter-block (with a commutative numpy op), all-gather (up to 1 MiB) or broadcast
past the slots and from its :func:`direct_threshold`, by direct reads of the peers' buffers
(:mod:`pycomm.shmdirect`) where every peer can be read by cross-memory attach. Either
only when neither ``algorithm=`` nor ``PYCOMM_ALGORITHM_<COLLECTIVE>`` names an
algorithm (MPICH likewise tries its shared-memory collectives first unless the user
forces an algorithm). Ranks whose limits differ may take different paths for one call;
each sees the other's path in its slot header, and all take messages.
"""

from __future__ import annotations

from typing import Any

from . import config, shmcoll, shmdirect, slotkernels
from .signature import signature

__all__ = ["DIRECT_FROM", "MAX_PLANS", "SHARED_SLOTS", "UNDECIDED", "direct_threshold",
           "fast_path", "kept", "plan_call", "slot_limit", "slots_of", "takes_slots",
           "unforced"]

SHARED_SLOTS = "shared_slots"   # the algorithm name of a call through pycomm.shmcoll
UNDECIDED = object()            # Communicator._slots before its first plan

MAX_PLANS = 1024            # shapes kept per communicator; past it the cache starts over

# registry name (pycomm.collectives) -> the call's name in signatures and messages
_CALL_NAMES = {"allreduce": "Allreduce", "bcast": "Bcast", "barrier": "Barrier",
               "allgather": "Allgather", "reduce": "Reduce",
               "reduce_scatter_block": "Reduce_scatter_block", "alltoall": "Alltoall",
               "gather": "Gather", "scatter": "Scatter"}


# bytes one rank puts in its slot, from the call's nbytes (see pycomm.collectives)
_SLOT_BYTES = {"barrier": lambda nbytes, size: 0,
               "bcast": lambda nbytes, size: nbytes,
               "allreduce": lambda nbytes, size: nbytes,
               "reduce": lambda nbytes, size: nbytes,
               "allgather": lambda nbytes, size: nbytes // size,
               "reduce_scatter_block": lambda nbytes, size: nbytes,
               "alltoall": lambda nbytes, size: nbytes}


# the collectives pycomm.shmdirect serves: count is the buffer's elements for allreduce
# and bcast, one rank's block for the other two (as their slot kernels take it)
_DIRECT = {"allreduce": shmdirect.direct_allreduce,
           "reduce_scatter_block": shmdirect.direct_reduce_scatter_block,
           "allgather": shmdirect.direct_allgather,
           "bcast": shmdirect.direct_bcast}


# Where each collective starts reading directly, with a core per rank and
# PYCOMM_SHM_DIRECT_BYTES unset: from these sizes on, direct reads were as fast as the
# automatic message algorithm or faster at 2, 4, 8 and 16 ranks on a 16-core machine, and
# below them slower at some rank count (benchmarks/README.md, "Where direct reads start").
# With more ranks than cores every collective starts at the variable's default. A call the
# shared-memory slots hold takes them first (fast_path): a reduce-scatter-block reads
# directly only past PYCOMM_SHM_COLL_BYTES, an all-gather past that much a rank.
DIRECT_FROM = {"allreduce": 256 << 10, "allgather": 256 << 10, "bcast": 128 << 10,
               "reduce_scatter_block": 16 << 10}


def slots_of(comm):
    """``comm``'s :class:`pycomm.shmcoll.SharedSlots` or None, decided once (when the
    communicator's transports are known)."""
    slots = comm._slots
    if slots is UNDECIDED:
        if getattr(comm, "transport_name", None) is None:
            return None
        slots = comm._slots = shmcoll.slots_for(comm)
    return slots


def unforced(collective: str, algorithm) -> bool:
    """Neither ``algorithm=`` nor ``PYCOMM_ALGORITHM_<COLLECTIVE>`` names an algorithm."""
    if algorithm not in (None, "auto"):
        return False
    if algorithm is None:
        forced = config.algorithm_override(collective)
        if forced is not None and forced.lower() != "auto":
            return False
    return True


def kept(comm, key: tuple, make):
    """What ``make()`` gives for ``key`` on ``comm``, kept with the communicator's plans
    until the configuration changes (:func:`pycomm.config.reload`). ``key`` must not
    look like a plan's (those are 6-tuples, see :func:`plan_call`)."""
    plans = comm._plans
    if plans is None or comm._plans_gen != config.generation or len(plans) >= MAX_PLANS:
        plans = comm._plans = {}
        comm._plans_gen = config.generation
    value = plans.get(key)
    if value is None:
        value = plans[key] = make()
    return value


def slot_limit(slots, collective: str, algorithm=None) -> int:
    """The most bytes one rank may put in its slot in a call of ``collective`` whose
    shape is not planned once (object calls, ``Alltoallv``) with ``algorithm=`` (None or
    ``"auto"``): the slot, or ``PYCOMM_SHM_COLL_BYTES``; -1 (not even an empty one) where
    an algorithm is named (:func:`unforced`). Kept with the plans (:func:`kept`):
    reading the environment costs about what a small call's exchange does."""
    return kept(slots.comm, ("slot limit", collective, algorithm), lambda: min(
        slots.limit, config.get("PYCOMM_SHM_COLL_BYTES")) if unforced(collective, algorithm)
        else -1)


def takes_slots(comm, collective: str, nbytes: int, algorithm) -> bool:
    """Whether a blocking call of ``collective`` on ``nbytes`` (as :mod:`pycomm.collectives`
    counts them) with ``algorithm=`` goes through shared-memory slots on ``comm``."""
    # (decided at the first plan whatever it is: a rank whose communicator has not decided
    # its slots does not say that it entered a call by messages, so peers in the slots of
    # a later call would wait for it; pycomm.calls.CollectiveCalls.begin)
    slots = slots_of(comm)
    if collective not in _SLOT_BYTES or not unforced(collective, algorithm):
        return False
    return slots is not None and _SLOT_BYTES[collective](nbytes, comm.size) <= min(
        slots.limit, config.get("PYCOMM_SHM_COLL_BYTES"))


def direct_threshold(comm, collective: str) -> int:
    """The fewest bytes (as :mod:`pycomm.collectives` counts them) from which a blocking
    ``collective`` on ``comm`` reads its peers' buffers directly: ``PYCOMM_SHM_DIRECT_BYTES``
    where it is set (0: never); else :data:`DIRECT_FROM`'s figure with a core per rank, or
    the variable's default (256 KiB) where ranks outnumber cores."""
    limit = config.explicit("PYCOMM_SHM_DIRECT_BYTES")
    if limit is not None:
        return limit
    if comm._selection.oversubscription() > 1.0:
        return config.VARS["PYCOMM_SHM_DIRECT_BYTES"].default
    return DIRECT_FROM[collective]


def takes_direct(comm, collective: str, nbytes: int, algorithm, op) -> bool:
    """Whether a blocking all-reduce or reduce-scatter-block (with ``op`` commutative and
    a numpy ufunc), all-gather or broadcast of ``nbytes`` (as :mod:`pycomm.collectives`
    counts them) with ``algorithm=`` reads its peers' buffers directly on ``comm``
    (:mod:`pycomm.shmdirect`; from :func:`direct_threshold` bytes on)."""
    if collective not in _DIRECT:
        return False
    if collective not in ("allgather", "bcast") and (op is None or not op.commutative
                                                     or op._ufunc is None):
        return False
    if collective == "allgather" and nbytes > shmdirect.ALLGATHER_MAX_BYTES:
        return False
    slots = slots_of(comm)
    if slots is None or not unforced(collective, algorithm):
        return False
    limit = direct_threshold(comm, collective)
    return 0 < limit <= nbytes and shmdirect.usable(slots)


def fast_path(comm, collective: str, nbytes: int, algorithm, op=None) -> str | None:
    """The name of the path that replaces a blocking call's message algorithm on ``comm``
    (``"shared_slots"`` or ``"shm_direct"``), or None."""
    if takes_slots(comm, collective, nbytes, algorithm):
        return SHARED_SLOTS
    if takes_direct(comm, collective, nbytes, algorithm, op):
        return shmdirect.SHM_DIRECT
    return None


def _fast_plan(comm, collective, dtype, count, root, nbytes, algorithm, sig, fn, op):
    """The plan that may replace the message plan ``(sig, ..., fn, op)`` of a blocking
    call (through shared-memory slots, or by direct reads), or None."""
    path = fast_path(comm, collective, nbytes, algorithm, op)
    if path is None:
        return None
    if path == SHARED_SLOTS:
        kernel = slotkernels.kernel(comm._slots, collective, dtype, count, root, op, fn)
    elif collective == "allgather":
        kernel = shmdirect.direct_allgather(comm._slots, dtype, count, fn)
    elif collective == "bcast":
        kernel = shmdirect.direct_bcast(comm._slots, dtype, count, root, fn)
    else:
        kernel = _DIRECT[collective](comm._slots, dtype, count, op, fn)
    fast = (sig, path, kernel, op, True)
    if comm._debug:     # each call logged as the selection logs it (AlgorithmSelection.run)
        return fast + (lambda *args: comm._slots_call(fast, collective, nbytes, *args),)
    return fast + (comm._calls.fast_runner(sig, collective, nbytes, path, kernel),)


def plan_call(comm, collective: str, dtype, count: int, nbytes: int, algorithm,
              op=None, root: int = -1) -> tuple[Any, str, Any, Any, Any]:
    """The plan ``(signature, algorithm name, function, op, fast)`` of one call on
    ``comm``: ``fast`` is the plan through shared-memory slots that a blocking call runs
    instead (None: there is none); in such a plan itself, ``fast`` is True.

    Args:
        comm: the :class:`pycomm.comm.Communicator`.
        collective: registry name, e.g. ``"allreduce"``.
        dtype: numpy dtype of the call's elements (None for Barrier).
        count: elements in the call's signature (-1: none).
        nbytes: the bytes the algorithm choice is made on (see :mod:`pycomm.collectives`).
        algorithm: the caller's ``algorithm=`` (None, ``"auto"`` or a name).
        op: the reduction op, or None.
        root: the root rank, or -1.

    Returns:
        The signature, the algorithm's name and function, the checked op, and the
        shared-memory plan (or None).

    Raises:
        ArgumentError: ``op`` is not a :class:`pycomm.ops.Op` or not defined on ``dtype``;
            ``algorithm`` is unknown or cannot serve the call.
    """
    plans = comm._plans
    key = (collective, dtype, count, root, op, algorithm)
    if plans is not None and comm._plans_gen == config.generation:
        try:
            return plans[key]
        except KeyError:        # a new shape
            pass
        except TypeError:       # an unhashable op or algorithm: refused below
            pass
    if op is not None:
        op = comm._check_op(op, dtype)
    name, fn = comm._selection.choose(collective, nbytes, algorithm,
                                      op.commutative if op is not None else True)
    sig = signature(_CALL_NAMES[collective], dtype, count, root, op)
    plan = (sig, name, fn, op, _fast_plan(comm, collective, dtype, count, root, nbytes,
                                          algorithm, sig, fn, op))
    if getattr(comm, "transport_name", None) is not None:
        if plans is None or comm._plans_gen != config.generation or len(plans) >= MAX_PLANS:
            plans = comm._plans = {}
            comm._plans_gen = config.generation
        plans[key] = plan
    return plan
