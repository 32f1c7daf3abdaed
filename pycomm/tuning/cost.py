"""The α-β-γ-σ cost model the automatic algorithm choice minimises.

Modelled time of one call = ``α`` per message on the critical path + ``β`` per byte moved
+ ``γ`` per byte reduced + ``σ`` per byte of freshly allocated scratch, where a message
larger than the eager limit pays the rendezvous protocol's ``α_rndv`` and ``β_rndv``
instead (two regimes of one Hockney line, as NCCL's tuner keeps a latency and a bandwidth
per protocol in ``graph/tuning.cc``). ``n`` is the bytes of the call as defined in
:func:`pycomm.collectives.choose`, ``p`` the number of ranks. Only the ranking matters:
constants shift the crossovers, not the shapes.

Each schedule is priced once, step by step (:data:`SCHEDULES`, see
:mod:`pycomm.tuning.cost_steps`): each message by its protocol, every step paying a
measured wake-up per turn of the cores when ranks outnumber cores
(``oversubscription > 1``), concurrent copies sharing the cores and the memory's lanes.
With a core per rank and one protocol the sums are the closed forms of Thakur,
Rabenseifner & Gropp 2005, "Optimization of collective communication operations in
MPICH", which each algorithm's module docstring gives (:mod:`pycomm.collectives.allreduce`
and its siblings), plus the σ term and a measured exchange step ``α_x`` (a step in which
every rank both sends and receives) where a one-way message costs ``α``.

Why σ: numpy scratch buffers come from fresh pages whose first touch page-faults; it is
what separates recursive doubling (scratch ``n``) from the segmented schedules (ring,
Rabenseifner: scratch two segments) at large ``n``. (Scratch of 1 MiB and more is reused
between calls, :mod:`pycomm.collectives.scratch`, so the measured σ is near 0.)

Constants: one :class:`Constants` per transport, measured by ``python -m pycomm.tuning.tune`` (see
:mod:`pycomm.tuning.tune`). The table shipped in ``pycomm/tuning/tuned.json`` records the run
it came from under ``"source"``; ``PYCOMM_TUNE_FILE`` points to a user table instead (a
transport missing there falls back to the shipped table). Transports without an entry use
``shm``'s constants.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable

from pycomm import config
from pycomm.tuning.cost_steps import (SCHEDULES, Constants, Pricing, pipeline_candidates,
                                      pipeline_segment)
from pycomm.errors import ArgumentError

__all__ = ["Constants", "SCHEDULES", "DEFAULT_TRANSPORT", "NET", "SHIPPED_TABLE",
           "constants", "cost", "load_table", "model_transport", "pricing", "segment_bytes"]

DEFAULT_TRANSPORT = "shm"
SHIPPED_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuned.json")


# Used only when the shipped table is missing or unreadable (e.g. a broken install):
# first estimates for shared memory on a 2-core machine.
FALLBACK = Constants(alpha=8e-6, beta=1 / 6e9, gamma=1 / 4e9, sigma=1 / 5e9)

_tables: dict[str, dict[str, Constants]] = {}


# Each scalar of a table's entry -> its default when absent: None, required; a name, that
# figure (the rendezvous and exchange figures of tables from before they were measured).
_SCALARS = {"alpha": None, "beta": None, "gamma": None, "sigma": None, "wake": 0.0,
            "alpha_rndv": "alpha", "beta_rndv": "beta", "alpha_x": "alpha"}


def _parse(path: str) -> dict[str, Constants]:
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ArgumentError(f"cost-model table {path!r} cannot be read: {exc}; write one "
                            "with python -m pycomm.tuning.tune --out FILE") from None
    table = {}
    for transport, entry in raw.items():
        if transport == "source":
            continue
        where = f"cost-model table {path!r}: entry {transport!r}"
        values: dict[str, float] = {}
        for name, default in _SCALARS.items():
            try:
                values[name] = float(entry[name] if name in entry or default is None
                                     else values.get(default, default))
            except (TypeError, KeyError, ValueError):
                raise ArgumentError(f"{where} needs numeric alpha, beta, gamma and sigma"
                                    if default is None else
                                    f"{where} has a non-numeric {name}") from None
            if not (math.isfinite(values[name]) and values[name] >= 0):
                raise ArgumentError(f"{where} has a negative or non-finite constant: "
                                    f"{name} = {values[name]}")
        wake_x = _curve(where, entry, "wake_x", "{ranks per core > 1: seconds >= 0}",
                        lambda o, v: o > 1 and v >= 0)
        lanes = _curve(where, entry, "lanes", "{bytes: concurrent copies >= 1}",
                       lambda b, v: b > 0 and v >= 1)
        table[transport] = Constants(**values, lanes=lanes, wake_x=wake_x)
    return table


def _curve(where: str, entry: dict, name: str, shape: str,
           valid: Callable[[float, float], bool]) -> tuple[tuple[float, float], ...]:
    """``entry[name]`` (``{x: y}``, absent: empty) as ascending ``(x, y)`` pairs, each
    finite and ``valid``; else ArgumentError naming ``where`` (the file and entry) and
    the expected shape."""
    try:
        pts = tuple(sorted((float(x), float(y))
                           for x, y in dict(entry.get(name) or {}).items()))
    except (TypeError, ValueError):
        pts = ((math.nan, math.nan),)
    if not all(math.isfinite(x) and math.isfinite(y) and valid(x, y) for x, y in pts):
        raise ArgumentError(f"{where} needs {name} as {shape}, got {entry.get(name)!r}")
    return pts


def load_table(path: str | None = None) -> dict[str, Constants]:
    """Return ``{transport: Constants}`` from ``path`` merged over the shipped table.

    Args:
        path: a JSON table as written by ``python -m pycomm.tuning.tune``; None reads
            ``PYCOMM_TUNE_FILE`` (unset: the shipped table alone). Results are cached
            per path.

    Raises:
        ArgumentError: the file cannot be read or an entry is malformed (the message
            names the file).
    """
    if path is None:
        path = config.get("PYCOMM_TUNE_FILE") or ""
    hit = _tables.get(path)
    if hit is None:
        try:
            hit = _parse(SHIPPED_TABLE)
        except ArgumentError:
            hit = {}
        hit.setdefault(DEFAULT_TRANSPORT, FALLBACK)
        if path:
            hit = {**hit, **_parse(path)}
        _tables[path] = hit
    return hit


NET = "net"    # the table entry of the link between hosts (pycomm/tuning/tune_links.py)


def model_transport(transport_name: str | None, nhosts: int | None = None) -> str:
    """The table a communicator is priced with: the slowest link its steps cross.

    Args:
        transport_name: the communicator's ``transport_name`` (e.g. ``"shm+tcp"``).
        nhosts: hosts the communicator spans (its ``host_layout``), None if unknown.

    Returns:
        ``shm`` for a communicator on one host whose ranks share memory (a host's part of
        a multi-host job, whose ``transport_name`` names the job's network transport too);
        :data:`NET` for one spanning hosts when the table has that entry (measured between
        hosts); else the slowest transport named (``tcp``, then ``rdma``), else ``shm``.
    """
    name = transport_name or DEFAULT_TRANSPORT
    if nhosts == 1 and DEFAULT_TRANSPORT in name.split("+"):
        return DEFAULT_TRANSPORT
    if nhosts is not None and nhosts > 1 and NET in load_table():
        return NET
    return "tcp" if "tcp" in name else ("rdma" if "rdma" in name else DEFAULT_TRANSPORT)


def constants(transport: str = DEFAULT_TRANSPORT) -> Constants:
    """Return the constants of ``transport`` (``shm``'s when the table has none for it)."""
    table = load_table()
    return table.get(transport) or table[DEFAULT_TRANSPORT]


def pricing(transport: str, nbytes: float, size: int,
            oversubscription: float = 1.0) -> Pricing:
    """The :class:`~pycomm.tuning.cost_steps.Pricing` of a call of ``nbytes`` on ``size``
    ranks at ``oversubscription`` ranks per core, with ``transport``'s constants: each
    message priced by the protocol it goes by, eager up to ``PYCOMM_EAGER_LIMIT`` bytes
    when the table has rendezvous figures."""
    k = constants(transport)
    eager = math.inf if k.alpha_rndv is None else float(config.get("PYCOMM_EAGER_LIMIT"))
    return Pricing.of(k, float(nbytes), size, oversubscription, eager)


def segment_bytes(collective: str, algorithm: str, nbytes: int, size: int,
                  transport: str = DEFAULT_TRANSPORT,
                  oversubscription: float = 1.0) -> int | None:
    """Return the segment (bytes) the model prices a pipelined schedule with, or None.

    Only the chain broadcast (``bcast``/``pipeline``) has one: ``PYCOMM_SEGMENT_BYTES`` when
    set, else the candidate its step model prices lowest for ``nbytes`` on ``size`` ranks
    (:func:`~pycomm.tuning.cost_steps.pipeline_segment`). Every rank computes the same
    value from the same arguments, so :func:`pycomm.collectives.choose` passes it to the
    schedule, which then runs what was priced.
    """
    if (collective, algorithm) != ("bcast", "pipeline"):
        return None
    if size <= 1:
        return pipeline_candidates(float(nbytes))[0]
    return pipeline_segment(float(nbytes), size,
                            pricing(transport, nbytes, size, oversubscription))


def cost(collective: str, algorithm: str, nbytes: int, size: int,
         transport: str = DEFAULT_TRANSPORT, oversubscription: float = 1.0) -> float:
    """Return the modelled seconds of one call.

    Args:
        collective: e.g. ``"allreduce"``.
        algorithm: e.g. ``"ring"``.
        nbytes: bytes of the call (see :func:`pycomm.collectives.choose`), ``>= 0``.
        size: number of ranks, ``>= 1``.
        transport: whose constants to use (``"shm"``, ``"tcp"``; others use ``shm``'s).
        oversubscription: ranks per core on the busiest host (> 1: more ranks than
            cores, ``size / oversubscription`` cores in all). Then every step of the
            schedule pays ``wake`` once per turn of the cores its ranks need, and
            concurrent copies and reductions share the cores.

    The schedule's steps (:data:`SCHEDULES`) are summed with the call's
    :func:`pricing`: each message by the protocol it goes by, ``alpha``/``beta`` up to
    ``PYCOMM_EAGER_LIMIT`` bytes, ``alpha_rndv``/``beta_rndv`` above.

    Raises:
        KeyError: the model has no price for the pair.
    """
    schedule = SCHEDULES[(collective, algorithm)]
    if size <= 1:
        return 0.0
    return schedule(float(nbytes), size, pricing(transport, nbytes, size, oversubscription))
