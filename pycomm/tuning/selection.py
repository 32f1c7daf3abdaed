"""Which algorithm a communicator's collective runs: the choice, its cache, the debug log.

Each :class:`pycomm.comm.Communicator` holds one :class:`AlgorithmSelection` (its
``_selection``), which runs every collective call's schedule. Every rank of a communicator
must run the same schedule, so the inputs of the choice are the same on every rank: the
collective, its byte count, the op's commutativity, ``algorithm=`` or
``PYCOMM_ALGORITHM_<COLLECTIVE>``, and the model's inputs agreed at start-up (size,
transport, ranks per core). The rule itself is :func:`pycomm.collectives.choose`. Choices
are cached; the configuration they read is read again after :func:`pycomm.config.reload`
(the cache is keyed on its generation), never per call.
"""

from __future__ import annotations

import sys
import time

from .. import config, trace as _trace
from ..collectives import choose, model_time
from .cost import model_transport
from ..errors import ArgumentError
from ..ops import SUM as _BUILTIN_SUM, Op
from ..plan import fast_path

__all__ = ["AlgorithmSelection"]

_CHOICES: dict = {}


class AlgorithmSelection:
    """Choosing, caching, running and logging the algorithm of one communicator's calls.

    It reads, from its communicator, what every rank agreed on (``size``, ``rank``,
    ``transport_name``, ``host_layout``, the engine's ranks per core), the call's sequence
    number, and whether the call is a nonblocking twin (``_defer``).

    Args:
        comm: the :class:`pycomm.comm.Communicator` it chooses for.
    """

    __slots__ = ("comm",)

    def __init__(self, comm):
        self.comm = comm

    def chosen_algorithm(self, collective: str, nbytes: int, *, commutative: bool = True,
                         algorithm: str | None = None, blocking: bool = True,
                         op: Op | None = None) -> str:
        """The algorithm a call would run (see
        :meth:`pycomm.comm.Communicator.chosen_algorithm`)."""
        name = self.choose(collective, int(nbytes), algorithm, commutative)[0]
        if not blocking:
            return name
        if op is None:     # a commutative op is taken to be a built-in one (a numpy ufunc)
            op = _BUILTIN_SUM if commutative else None
        fast = fast_path(self.comm, collective, int(nbytes), algorithm, op)
        return fast or name

    def choose(self, collective: str, nbytes: int, algorithm, commutative: bool):
        """``(name, fn)`` of :func:`pycomm.collectives.choose` for this communicator, cached.

        Raises:
            ArgumentError: ``algorithm`` is neither None nor a name (a str), or names no
                algorithm of ``collective``.
        """
        if algorithm is not None and not isinstance(algorithm, str):
            raise ArgumentError(f"rank {self.comm.rank}: algorithm must be an algorithm's "
                                f"name (str) or None, got {type(algorithm).__name__} "
                                f"{algorithm!r}")
        # A pure function of these, the configuration (read again after a reload) and the
        # model's inputs (size, transport, ranks per core: the world's change once, at
        # start-up, after its first collectives), so cached.
        key = (collective, nbytes, algorithm, commutative, config.generation)
        hit = _CHOICES.get(key)
        comm = self.comm
        eng = comm._engine
        layout = getattr(comm, "host_layout", None)   # hosts: hierarchical algorithms
        model = (comm.size, eng.oversubscription, eng.min_cores,
                 getattr(comm, "transport_name", None), layout)
        if hit is None or hit[2] != model:
            try:
                name, fn = choose(collective, nbytes, comm.size, requested=algorithm,
                                  commutative=commutative, transport=self.model_transport(),
                                  oversubscription=self.oversubscription(),
                                  hosts=None if layout is None else
                                  tuple(map(len, layout.hosts)))
            except ArgumentError as exc:        # (the rule knows no ranks)
                raise ArgumentError(f"rank {comm.rank}: {exc}") from None
            if len(_CHOICES) > 4096:
                _CHOICES.clear()
            _CHOICES[key] = (name, fn, model)
            return name, fn
        return hit[0], hit[1]

    def run(self, collective: str, nbytes: int, algorithm, op: Op | None, call, *,
            log_bytes: int | None = None, plan=None):
        """Choose the algorithm and run ``call(fn)`` (queue it, inside a nonblocking twin).

        ``log_bytes``: the bytes the debug log models when ``nbytes`` is not this rank's
        view of the call (the v-variants choose on 0 bytes: their counts are not known to
        every rank). ``plan``: the call's plan (:func:`pycomm.plan.plan_call`), whose
        algorithm is then run without choosing again.
        """
        if plan is not None:
            name, fn = plan[1], plan[2]
        else:
            name, fn = self.choose(collective, nbytes, algorithm,
                                   op.commutative if op is not None else True)
        comm = self.comm
        debug = comm._debug
        if not debug and comm._defer is None:  # the common case: no closure, no log
            # the flight recorder (pycomm.trace): a tuple, a slot write, two clock reads
            n = _trace.begin(collective, comm, comm._calls.seq, nbytes if log_bytes is None
                             else log_bytes, name, -1)
            try:
                out = call(fn)
            except BaseException as exc:
                _trace.fail(n, exc)
                raise
            _trace.end(n)
            return out
        seq = comm._calls.seq             # a nonblocking twin runs later: keep its number
        shown = nbytes if log_bytes is None else log_bytes

        def run(kind: str = ""):
            op_name = "i" + collective if kind else collective
            n = _trace.begin(op_name, comm, seq, shown, name, -1)
            try:
                out = (self._logged(collective, shown, name, kind, lambda: call(fn))
                       if debug else call(fn))
            except BaseException as exc:
                _trace.fail(n, exc)
                raise
            _trace.end(n)
            return out

        if comm._defer is not None:       # a nonblocking twin: the progress thread runs it
            comm._defer.append(lambda: run("nonblocking "))
            return None
        return run()

    def _logged(self, collective: str, nbytes: int, name: str, kind: str, call):
        """Run ``call()`` and print the PYCOMM_DEBUG line: algorithm, modelled and measured
        seconds (for a nonblocking collective, measured on the progress thread)."""
        t0 = time.perf_counter()
        out = call()
        measured = time.perf_counter() - t0
        try:
            modelled = 1e6 * model_time(collective, name, nbytes, self.comm.size,
                                        transport=self.model_transport(),
                                        oversubscription=self.oversubscription())
            modelled = f"{modelled:.1f} us"
        except Exception:                 # a collective the model does not cover
            modelled = "n/a"
        print(f"[pycomm rank {self.comm.rank}] {kind}{collective}({nbytes} B, "
              f"{self.comm.size} ranks): "
              f"{name}, modelled {modelled}, measured {1e6 * measured:.1f} us",
              file=sys.stderr)
        return out

    def model_transport(self) -> str:
        """The transport whose cost constants model this communicator (slowest link)."""
        layout = getattr(self.comm, "host_layout", None)
        return model_transport(getattr(self.comm, "transport_name", None),
                               None if layout is None else layout.nhosts)

    def oversubscription(self) -> float:
        """Ranks per core (the cost model's oversubscription factor).

        Every rank of a communicator must choose the same algorithm, so this uses only
        values all ranks agreed on at start-up (the busiest host's ranks per core, the
        fewest cores of any host), capped by this communicator's size.
        """
        eng = self.comm._engine
        return max(1.0, min(eng.oversubscription, self.comm.size / eng.min_cores))
