"""Attribute caching with keyvals (pycomm/MPI/keyvals.py) in one process, against what
mpi4py 4.1.2 + MPICH 5.0.2 do for the same calls (recorded on this machine): the copy
callback runs on Dup and Idup only (not Create, Split or a derived type constructor), the
delete callback on Delete_attr, on a replacing Set_attr and on Free, a callback's exception
is printed and raised as ERR_OTHER, and a key of another kind, a predefined key in
Set_attr/Delete_attr or an unknown key is ERR_KEYVAL. mpi4py's own test_attributes.py
(60 tests) passes at 1 and 2 ranks under ``launch.py --mpi4py`` as on MPICH.
"""

from __future__ import annotations

import numpy as np
import pytest

from pycomm import MPI


class Log:
    """Callbacks that record what they were called with; the copy adds 1."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.key = None

    def copy(self, obj, keyval, value):
        self.calls.append(("copy", type(obj).__name__, keyval == self.key, value))
        return value + 1

    def delete(self, obj, keyval, value):
        assert obj                      # the object is still alive in its callback
        self.calls.append(("delete", type(obj).__name__, keyval == self.key, value))


def test_comm_callbacks_run_on_dup_replace_delete_and_free():
    log = Log()
    log.key = MPI.Comm.Create_keyval(log.copy, log.delete)
    comm = MPI.COMM_WORLD.Dup()
    comm.Set_attr(log.key, 10)
    comm.Set_attr(log.key, 11)                      # replacing deletes the old value
    dup = comm.Dup()
    assert dup.Get_attr(log.key) == 12
    dup.Free()
    assert comm.Create(comm.Get_group()).Get_attr(log.key) is None
    assert comm.Split(0, 0).Get_attr(log.key) is None
    idup, req = comm.Idup()
    req.Wait()
    assert idup.Get_attr(log.key) == 12
    comm.Free()
    name = type(dup).__name__
    assert log.calls == [("delete", name, True, 10), ("copy", name, True, 11),
                         ("delete", name, True, 12), ("copy", name, True, 11),
                         ("delete", name, True, 11)]
    assert comm == MPI.COMM_NULL
    idup.Free()
    assert MPI.Comm.Free_keyval(log.key) == MPI.KEYVAL_INVALID


def test_copy_flags_and_not_implemented():
    world = MPI.COMM_WORLD
    keep = MPI.Comm.Create_keyval(copy_fn=True)
    drop = MPI.Comm.Create_keyval(copy_fn=False)
    none = MPI.Comm.Create_keyval(copy_fn=lambda o, k, v: NotImplemented)
    value = [1, 2, 3]
    comm = world.Dup()
    for key in (keep, drop, none):
        comm.Set_attr(key, value)
    dup = comm.Dup()
    assert dup.Get_attr(keep) is value
    assert dup.Get_attr(drop) is None and dup.Get_attr(none) is None
    for c in (dup, comm):
        c.Free()


def test_keys_of_another_kind_predefined_and_unknown_keys_are_err_keyval():
    comm = MPI.COMM_WORLD.Dup()
    type_key = MPI.Datatype.Create_keyval()
    for call in (lambda: comm.Get_attr(123456), lambda: comm.Set_attr(type_key, 1),
                 lambda: comm.Get_attr(type_key), lambda: comm.Set_attr(MPI.TAG_UB, 5),
                 lambda: comm.Delete_attr(MPI.TAG_UB),
                 lambda: comm.Set_attr(MPI.KEYVAL_INVALID, 1)):
        with pytest.raises(MPI.Exception) as err:
            call()
        assert err.value.Get_error_class() == MPI.ERR_KEYVAL
    assert comm.Get_attr(MPI.TAG_UB) >= 32767               # predefined keys still read
    comm.Delete_attr(MPI.Comm.Create_keyval())              # nothing set: nothing happens
    with pytest.raises(MPI.Exception) as err:
        MPI.COMM_NULL.Set_attr(MPI.Comm.Create_keyval(), 1)
    assert err.value.Get_error_class() == MPI.ERR_COMM
    with pytest.raises(TypeError, match="copy_fn must be None, a bool or a callable"):
        MPI.Comm.Create_keyval(copy_fn=5)                   # MPICH takes it; fails at Dup
    comm.Free()


def test_a_freed_key_keeps_its_values_but_takes_no_new_one():
    log = Log()
    log.key = key = MPI.Comm.Create_keyval(None, log.delete)
    comm = MPI.COMM_WORLD.Dup()
    comm.Set_attr(key, "v")
    assert MPI.Comm.Free_keyval(key) == MPI.KEYVAL_INVALID
    assert comm.Get_attr(key) == "v"
    with pytest.raises(MPI.Exception) as err:
        comm.Set_attr(key, "w")
    assert err.value.Get_error_class() == MPI.ERR_KEYVAL
    comm.Free()                                             # the delete callback still runs
    assert log.calls == [("delete", type(comm).__name__, True, "v")]


def test_a_freed_key_is_forgotten_once_its_last_value_is_deleted():
    from pycomm.MPI import keyvals
    before = len(keyvals._KEYVALS)
    for _ in range(50):                                     # no values: gone at once
        MPI.Comm.Free_keyval(MPI.Comm.Create_keyval())
        MPI.Datatype.Free_keyval(MPI.Datatype.Create_keyval())
    assert len(keyvals._KEYVALS) == before
    key = MPI.Comm.Create_keyval(copy_fn=True)
    comm = MPI.COMM_WORLD.Dup()
    comm.Set_attr(key, 1)
    comm.Set_attr(key, 2)                                   # a replaced value: still one
    dup = comm.Dup()                                        # the copy is a second value
    MPI.Comm.Free_keyval(key)
    comm.Delete_attr(key)
    assert dup.Get_attr(key) == 2 and key in keyvals._KEYVALS
    dup.Free()                                              # the last value
    assert key not in keyvals._KEYVALS
    comm.Free()
    dtkey = MPI.Datatype.Create_keyval()
    dt = MPI.DOUBLE.Dup()
    dt.Set_attr(dtkey, "x")
    MPI.Datatype.Free_keyval(dtkey)
    dt.Free()
    assert dtkey not in keyvals._KEYVALS and len(keyvals._KEYVALS) == before
    # a datatype handle collected unfreed: its values go (no callback), and their key
    import gc
    dtkey = MPI.Datatype.Create_keyval()
    dt = MPI.INT.Dup()
    dt.Set_attr(dtkey, "y")
    MPI.Datatype.Free_keyval(dtkey)
    assert dtkey in keyvals._KEYVALS
    del dt
    gc.collect()
    assert dtkey not in keyvals._KEYVALS and len(keyvals._KEYVALS) == before


def test_a_raising_callback_is_printed_and_err_other(capfd):
    def boom(obj, keyval, value):
        raise ValueError("from the callback")
    key = MPI.Comm.Create_keyval(copy_fn=boom, delete_fn=boom)
    comm = MPI.COMM_WORLD.Dup()
    comm.Set_attr(key, 1)
    for call in (comm.Dup, lambda: comm.Delete_attr(key)):
        with pytest.raises(MPI.Exception) as err:
            call()
        assert err.value.Get_error_class() == MPI.ERR_OTHER
        assert "ValueError: from the callback" in capfd.readouterr().err
    assert comm.Get_attr(key) is None                       # deleted all the same
    comm.Set_attr(key, 2)
    with pytest.raises(MPI.Exception):
        comm.Free()                                         # freed all the same
    assert comm == MPI.COMM_NULL


def test_datatype_attributes_copy_on_dup_only_and_delete_on_free():
    log = Log()
    log.key = MPI.Datatype.Create_keyval(log.copy, log.delete)
    t = MPI.INT.Dup()
    t.Set_attr(log.key, 1)
    t2 = t.Dup()
    assert t2.Get_attr(log.key) == 2
    assert t.Create_contiguous(2).Get_attr(log.key) is None
    t2.Free()
    t.Free()
    assert t == MPI.DATATYPE_NULL and t2 == MPI.DATATYPE_NULL and not t
    assert log.calls == [("copy", "Datatype", True, 1), ("delete", "Datatype", True, 2),
                         ("delete", "Datatype", True, 1)]
    # predefined types take attributes too (MPICH), and keep them apart
    key = MPI.Datatype.Create_keyval()
    MPI.INT.Set_attr(key, "int")
    assert MPI.INT.Get_attr(key) == "int" and MPI.FLOAT.Get_attr(key) is None
    MPI.INT.Delete_attr(key)


def test_window_attributes_delete_on_free():
    log = Log()
    log.key = MPI.Win.Create_keyval(delete_fn=log.delete)
    win = MPI.Win.Allocate(8, comm=MPI.COMM_SELF)
    win.Set_attr(log.key, np.int64(5))
    assert win.Get_attr(log.key) == 5 and win.Get_attr(MPI.WIN_SIZE) == 8
    with pytest.raises(MPI.Exception) as err:
        win.Set_attr(MPI.WIN_SIZE, 1)
    assert err.value.Get_error_class() == MPI.ERR_KEYVAL
    win.Free()
    assert log.calls == [("delete", "Win", True, 5)]
