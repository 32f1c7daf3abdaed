"""The wrapper every collective method gets (:func:`pycomm.signature.collective`).

It is compiled with the method's own parameters; these tests check, on a communicator
stand-in, that it passes every argument through as the method receives it, and that a
call the method refuses with a TypeError (an argument too many, an unknown keyword, a
missing one, one given twice) is still counted and abandoned, with the method's own
message, as every failed collective call is.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from pycomm.signature import collective


class _Calls:
    def __init__(self):
        self.seq = 0
        self.aborts_seen = 0
        self.abandoned = []

    def abandon(self, name, seq, exc):
        self.abandoned.append((name, seq, type(exc).__name__))


class _Comm:
    """What the wrapper reads of a communicator."""

    def __init__(self):
        self._calls = _Calls()
        self._engine = SimpleNamespace(aborted={}, coll_tags={}, abort_count=0,
                                       offload_posted=0, offload_done=0)
        self._defer = None
        self._cctx = 1
        self.name = "fake"

    def _count(self):
        self._calls.seq += 1

    def raw_allreduce(self, sendbuf, recvbuf, op="SUM", *, algorithm=None):
        self._count()
        return (sendbuf, recvbuf, op, algorithm)

    def raw_barrier(self, *, algorithm=None):
        self._count()
        return algorithm

    def raw_bcast(self, buf, root=0, *, algorithm=None):
        self._count()
        return (buf, root, algorithm)

    def raw_nothing(self):
        self._count()
        return "done"

    Allreduce = collective(raw_allreduce)
    Barrier = collective(raw_barrier)
    Bcast = collective(raw_bcast)
    Nothing = collective(raw_nothing)


@pytest.mark.parametrize("args, kwargs", [
    ((1, 2), {}),
    ((1, 2, "MAX"), {}),
    ((1, 2), {"op": "MIN"}),
    ((1,), {"recvbuf": 2}),
    ((), {"recvbuf": 2, "sendbuf": 1, "algorithm": "ring"}),
    ((1, 2, "MAX"), {"algorithm": None}),
])
def test_arguments_reach_the_method_as_given(args, kwargs):
    comm = _Comm()
    assert comm.Allreduce(*args, **kwargs) == comm.raw_allreduce(*args, **kwargs)
    assert comm.Barrier(algorithm="x") == "x" and comm.Barrier() is None
    assert comm.Bcast(5) == (5, 0, None) and comm.Bcast(5, 1, algorithm="a") == (5, 1, "a")
    assert comm.Nothing() == "done"
    assert comm._calls.abandoned == []


@pytest.mark.parametrize("method, args, kwargs", [
    ("allreduce", (1, 2, "SUM", 4), {}),                # one positional too many
    ("allreduce", (1, 2, "SUM", 4, 5), {"algorithm": "x"}),
    ("allreduce", (1, 2), {"bogus": 1}),                # an unknown keyword
    ("allreduce", (1, 2), {"_more": 1}),
    ("allreduce", (1, 2), {"_unknown": 1}),
    ("allreduce", (1,), {}),                            # a missing argument
    ("allreduce", (), {"recvbuf": 2}),
    ("allreduce", (), {}),
    ("barrier", (1,), {}),
    ("barrier", (), {"root": 0}),
    ("bcast", (), {"root": 1}),
    ("bcast", (1, 0, 3), {}),
    ("nothing", (1,), {}),
    ("nothing", (), {"x": 1}),
    ("bcast", (5, 1), {"root": 1}),                     # one argument given twice
    ("bcast", (5, 1, 9), {"root": 1}),
    ("allreduce", (1, 2), {"sendbuf": 3}),
    ("allreduce", (1, 2, "SUM"), {"op": "MAX"}),
    ("allreduce", (1,), {"op": "MAX", "sendbuf": 3}),
])
def test_a_refused_call_is_counted_and_abandoned_with_the_methods_message(method, args,
                                                                          kwargs):
    comm = _Comm()
    raw = getattr(comm, f"raw_{method}")
    with pytest.raises(TypeError) as direct:
        raw(*args, **kwargs)
    wrapped = getattr(comm, {"allreduce": "Allreduce", "barrier": "Barrier",
                             "bcast": "Bcast", "nothing": "Nothing"}[method])
    with pytest.raises(TypeError) as through:
        wrapped(*args, **kwargs)
    assert str(through.value) == str(direct.value)
    # counted (the method never ran, so the wrapper counts it) and abandoned
    assert comm._calls.seq == 1
    assert comm._calls.abandoned == [(wrapped.__name__, 1, "TypeError")]


def test_parameters_named_like_the_wrappers_own_names_reach_the_method():
    class Comm(_Comm):
        def raw(self, seq, calls=None, *, method="m"):
            self._count()
            return (seq, calls, method)
        Raw = collective(raw)

    comm = Comm()
    assert comm.Raw(1) == (1, None, "m") and comm.Raw(1, 2, method="x") == (1, 2, "x")
    assert comm.Raw(seq=3, calls=4) == (3, 4, "m")


def test_the_wrapper_looks_like_the_method():
    for name in ("Allreduce", "Barrier", "Bcast", "Nothing"):
        wrapper, raw = getattr(_Comm, name), getattr(_Comm, f"raw_{name.lower()}")
        assert wrapper.__wrapped__ is raw
        assert inspect.signature(wrapper) == inspect.signature(raw)
        assert wrapper.__name__ == raw.__name__ and wrapper.__doc__ == raw.__doc__
