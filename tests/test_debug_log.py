"""PYCOMM_DEBUG=1: every collective logs its algorithm, modelled and measured time.

The ranks of the shared worlds started without the variable, so each task switches its
communicator's debug flag on (what ``PYCOMM_DEBUG=1`` sets at start-up) and captures its
own stderr; ``test_debug_variable_is_read_at_start`` checks the variable itself.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys

import cloudpickle
import numpy as np

import pycomm
from pycomm import config

cloudpickle.register_pickle_by_value(sys.modules[__name__])

LINE = re.compile(r"\[pycomm rank (\d+)\] (nonblocking )?(\w+)\((\d+) B, (\d+) ranks\): "
                  r"(\w+), modelled ([\d.]+ us|n/a), measured ([\d.]+) us")


def _logged_calls():
    comm = pycomm.COMM_WORLD
    p, r = comm.size, comm.rank
    err = io.StringIO()
    comm._debug = True
    try:
        with contextlib.redirect_stderr(err):
            buf = np.arange(1000, dtype=np.float32)
            comm.Allreduce(pycomm.IN_PLACE, buf, algorithm="recursive_doubling")
            comm.Iallreduce(pycomm.IN_PLACE, buf).Wait()
            comm.Bcast(buf, root=0)
            counts = [r + 1 for r in range(p)]
            recv = np.empty(sum(counts), dtype=np.float64) if r == 0 else None
            comm.Gatherv(np.ones(r + 1), [recv, counts] if r == 0 else None, root=0)
    finally:
        comm._debug = config.get("PYCOMM_DEBUG")
    return err.getvalue()


def test_debug_log_names_algorithm_and_times(world_small):
    for rank, text in enumerate(world_small.run(_logged_calls)):
        lines = [LINE.fullmatch(line) for line in text.strip().splitlines()]
        assert all(lines), text
        got = [(m[2] or "", m[3], int(m[4]), m[6]) for m in lines]
        p = world_small.size
        gathered = 8 * (p * (p + 1) // 2 if rank == 0 else rank + 1)  # this rank's bytes
        assert [g[:3] for g in got] == [("", "allreduce", 4000),
                                        ("nonblocking ", "allreduce", 4000),
                                        ("", "bcast", 4000), ("", "gatherv", gathered)]
        assert got[0][3] == "recursive_doubling"
        assert got[1][3] in pycomm.algorithms("allreduce")
        # a blocking 4000 B Bcast on one host's shared memory takes the slots
        slots = world_small.transport == "shm" and p > 1
        if slots:
            assert got[2][3] == "shared_slots"
        else:
            assert got[2][3] in pycomm.algorithms("bcast")
        assert all(int(m[1]) == rank and int(m[5]) == p for m in lines)
        if p > 1:  # the model covers the message algorithms: a time, not n/a
            assert all(m[7] != "n/a" and float(m[8]) > 0 for m in lines[:3]
                       if m[6] != "shared_slots")


def _debug_flag():
    return pycomm.COMM_WORLD._debug


def test_debug_variable_is_read_at_start(monkeypatch, no_shared_world):
    monkeypatch.setenv("PYCOMM_DEBUG", "1")
    assert pycomm.spawn(_debug_flag, 2) == [True, True]
