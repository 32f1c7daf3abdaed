"""Which algorithm a collective runs: ``PYCOMM_ALGORITHM_<COLLECTIVE>``, ``algorithm=``,
the refusal of an algorithm that cannot serve the call, and the choice cache (which reads
the configuration again after ``pycomm.config.reload()``, never per call). Real processes,
the shared worlds.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import pycomm


# -- algorithm override through the environment --------------------------------------------

def _rank_env_override():
    import pycomm.tuning.selection as comm_module
    comm = pycomm.COMM_WORLD
    chosen = []
    real_choose = comm_module.choose

    def spy(collective, *args, **kwargs):
        name, fn = real_choose(collective, *args, **kwargs)
        chosen.append(name)
        return name, fn

    var = "PYCOMM_ALGORITHM_ALLREDUCE"
    ring_segment = os.environ.get("PYCOMM_RING_SEGMENT_BYTES")  # tiny worlds set it

    def restore(value):
        if value is None:
            os.environ.pop("PYCOMM_RING_SEGMENT_BYTES", None)
        else:
            os.environ["PYCOMM_RING_SEGMENT_BYTES"] = value

    out = {}
    comm_module.choose = spy
    comm_module._CHOICES.clear()
    try:
        x = np.arange(10.0) + comm.rank
        comm.Allreduce(pycomm.IN_PLACE, x)          # planned before the variable is set
        os.environ[var] = "ring"
        n0 = len(chosen)
        comm.Allreduce(pycomm.IN_PLACE, x)
        out["set, no reload"] = len(chosen) - n0    # the plan stands: no choice made
        pycomm.config.reload()
        comm.Allreduce(pycomm.IN_PLACE, x)
        out["env=ring"] = chosen[-1]
        comm.Allreduce(pycomm.IN_PLACE, x, algorithm="recursive_doubling")
        out["env=ring, algorithm= wins"] = chosen[-1]
        try:
            comm.Allreduce(pycomm.IN_PLACE, x, op=pycomm.Op.Create(np.add, commute=False))
            out["ring + non-commutative op"] = "ran"
        except pycomm.ArgumentError as exc:
            out["ring + non-commutative op"] = str(exc)
        os.environ[var] = "no_such_algorithm"
        pycomm.config.reload()
        try:
            comm.Allreduce(pycomm.IN_PLACE, x)
            out["bad name"] = "ran"
        except pycomm.ArgumentError as exc:
            out["bad name"] = str(exc)
        del os.environ[var]
        pycomm.config.reload()
        comm_module._CHOICES.clear()    # the spy sees the choice (the first call cached it)
        comm.Allreduce(pycomm.IN_PLACE, x)
        out["unset"] = chosen[-1]
        out["model"] = comm.chosen_algorithm("allreduce", x.nbytes, algorithm="auto")
        # the choice is cached: a variable the model reads is read again after a reload,
        # never per call
        n0 = len(chosen)
        comm.chosen_algorithm("allreduce", x.nbytes, algorithm="auto")
        out["cached"] = len(chosen) - n0
        os.environ["PYCOMM_RING_SEGMENT_BYTES"] = str(4096 + len(os.environ.get(
            "PYCOMM_RING_SEGMENT_BYTES", "")))  # differs from what the world was given
        comm.chosen_algorithm("allreduce", x.nbytes, algorithm="auto")
        out["model variable changed, no reload"] = len(chosen) - n0
        pycomm.config.reload()
        comm.chosen_algorithm("allreduce", x.nbytes, algorithm="auto")
        restore(ring_segment)
        pycomm.config.reload()
        out["after a reload"] = len(chosen) - n0
        comm.Allreduce(pycomm.IN_PLACE, x)
        out["value"] = x.tolist()
    finally:
        os.environ.pop(var, None)
        restore(ring_segment)
        pycomm.config.reload()
        comm_module.choose = real_choose
        comm_module._CHOICES.clear()
    return out


def test_algorithm_environment_override(world):
    for rank, out in enumerate(world.run(_rank_env_override)):
        # configuration is read when a call's plan is made (pycomm.plan), not per call
        assert out["set, no reload"] == 0, out
        assert out["env=ring"] == "ring"
        assert out["env=ring, algorithm= wins"] == "recursive_doubling"
        if world.size > 1:
            assert "commutative" in out["ring + non-commutative op"]
            assert "PYCOMM_ALGORITHM_ALLREDUCE" in out["ring + non-commutative op"]
        assert "PYCOMM_ALGORITHM_ALLREDUCE" in out["bad name"] and "ring" in out["bad name"]
        # what ran when unset is the model's choice; a blocking call this small on one
        # host's shared memory goes through the slots instead (pycomm.shmcoll)
        slots = world.transport == "shm" and world.size > 1
        assert out["model"] == ("shared_slots" if slots else out["unset"]), out
        assert out["cached"] == 0 and out["model variable changed, no reload"] == 0
        assert out["after a reload"] == 1
        # 6 Allreduce calls of SUM actually ran (the refused ones moved nothing)
        s = world.size
        base = np.arange(10.0) * s + s * (s - 1) / 2
        assert out["value"] == (base * s ** 5).tolist()


# -- waiting: the yielding phase where ranks outnumber cores --------------------------------

def _rank_wait_settings():
    import os as _os
    from pycomm.waiting import default_yield_seconds
    eng = pycomm.COMM_WORLD._engine
    local = int(_os.environ.get("PYCOMM_LOCAL_SIZE") or pycomm.COMM_WORLD.size)
    return eng.yield_s, default_yield_seconds(local), eng.oversubscription


def test_real_ranks_yield_exactly_when_they_outnumber_the_cores(world):
    cores = len(os.sched_getaffinity(0))
    for yield_s, expected, oversubscription in world.run(_rank_wait_settings):
        assert yield_s == expected
        assert (yield_s > 0) == (world.size > cores)   # one host: every rank is local
        assert (yield_s > 0) == (oversubscription > 1.0)


def _rank_yield_s():
    return pycomm.COMM_WORLD._engine.yield_s


def test_yield_us_variable_overrides_the_default(monkeypatch):
    # PYCOMM_YIELD_US reaches every rank's engine, both ways: on where the default is off
    # (2 ranks, as many cores or more) and off where it is on (more ranks than cores)
    from pycomm.launch.spawning import spawn
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("PYCOMM_YIELD_US", "1234")
    assert spawn(_rank_yield_s, 2, transport="shm") == [pytest.approx(1234e-6)] * 2
    monkeypatch.setenv("PYCOMM_YIELD_US", "0")
    assert spawn(_rank_yield_s, cores + 1, transport="shm") == [0.0] * (cores + 1)
