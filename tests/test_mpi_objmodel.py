"""pycomm.MPI's object model as mpi4py's (pycomm/MPI/objmodel.py, handles.py, pickling.py).

Each expected value is what mpi4py 4.1.2 on MPICH 5.0.2 gives (one rank, no world needed).
"""

from __future__ import annotations

import copy
import pickle
import weakref

import pytest

from pycomm import MPI

NULLS = [MPI.DATATYPE_NULL, MPI.REQUEST_NULL, MPI.INFO_NULL, MPI.ERRHANDLER_NULL,
         MPI.SESSION_NULL, MPI.GROUP_NULL, MPI.WIN_NULL, MPI.OP_NULL, MPI.FILE_NULL,
         MPI.MESSAGE_NULL, MPI.COMM_NULL]


def test_handles_are_unhashable_and_take_weak_references():
    # MPICH: hash(obj) is a TypeError for every handle (pycomm.MPI's ops excepted: the
    # collectives cache call signatures by op); weakref.ref(obj) works, Status too
    for obj in [MPI.Status(), *NULLS, MPI.INT, MPI.SUM]:
        if not isinstance(obj, MPI.Op):
            with pytest.raises(TypeError):
                hash(obj)
        assert weakref.ref(obj)() is obj


def test_constructors_refuse_another_kind():
    # MPICH: MPI.Group(MPI.COMM_NULL), MPI.Message(1234)... are TypeErrors
    for obj in NULLS:
        for other in [x for x in NULLS if type(x) is not type(obj)] + [1234, "abc"]:
            with pytest.raises(TypeError):
                type(obj)(other)


def test_subclass_new_decides_what_is_copied():
    # MPICH: a subclass's __new__ may pass up another object than it was called with;
    # the class's check applies to that one (here: a Cartesian communicator)
    class MyCart(MPI.Cartcomm):
        def __new__(cls, comm=None):
            return super().__new__(cls, comm.Create_cart([comm.size]))

    cart = MyCart(MPI.COMM_SELF)
    assert type(cart) is MyCart and cart.Get_topology() == MPI.CART and cart.dims == [1]
    cart.Free()
    with pytest.raises(TypeError):
        MPI.Cartcomm(MPI.COMM_SELF)     # MPICH: TypeError, not a Cartesian communicator


def test_null_request_makes_null_persistent_and_generalized_requests():
    # MPICH: Prequest(REQUEST_NULL) and Grequest(REQUEST_NULL) are null handles; an
    # active non-persistent request is refused
    for cls in (MPI.Prequest, MPI.Grequest):
        r = cls(MPI.REQUEST_NULL)
        assert type(r) is cls and not r and r == MPI.REQUEST_NULL
    req = MPI.COMM_SELF.Isend((None, 0, MPI.BYTE), MPI.PROC_NULL)
    with pytest.raises(TypeError):
        MPI.Prequest(req)
    req.Wait()


def test_integer_handles_round_trip():
    # MPICH: handle == toint() == py2f(); fromint/f2py/fromhandle give an equal object;
    # COMM_NULL is 0x04000000, GROUP_EMPTY 0x48000000, FILE_NULL 0 (MPICH's values)
    assert MPI.COMM_NULL.toint() == 0x04000000 and MPI.FILE_NULL.py2f() == 0
    assert MPI.GROUP_EMPTY.handle == 0x48000000
    dup = MPI.INT.Dup()
    op = MPI.Op.Create(lambda a, b: None)
    for obj in (MPI.INT, MPI.SUM, MPI.COMM_SELF, MPI.INFO_ENV, MPI.ERRORS_RETURN, dup, op,
                MPI.MESSAGE_NO_PROC, *NULLS):
        n = obj.toint()
        assert 0 <= n < 2**31 and n == obj.py2f() == obj.handle
        for back in (type(obj).fromint(n), type(obj).f2py(n), type(obj).fromhandle(n)):
            assert back == obj and type(back) is type(obj) and back.toint() == n
    assert type(MPI.Comm.fromint(MPI.COMM_SELF.toint())) is MPI.Intracomm
    with pytest.raises(MPI.Exception) as err:          # MPICH: ERR_COMM for a bad integer
        MPI.Comm.fromint(0x04001234)
    assert err.value.Get_error_class() == MPI.ERR_COMM
    with pytest.raises(TypeError):
        MPI.Comm.fromint("x")
    dup.Free()
    op.Free()


def test_status_fortran_list():
    # MPICH: Status.py2f() is [count_lo, count_hi|cancelled, source, tag, error]
    st = MPI.Status()
    assert st.py2f() == [0, 0, MPI.ANY_SOURCE, MPI.ANY_TAG, 0]
    st.source, st.tag, st.error = 1, 2, MPI.ERR_OTHER
    back = MPI.Status.f2py(st.py2f())
    assert back == st and back.py2f()[MPI.F_TAG] == 2 and len(back.py2f()) == 5


def test_free_nulls_copies_of_predefined_objects_only():
    # MPICH: free() leaves a module constant alone; a copy of one (Datatype(MPI.INT)) and
    # a created object (Op.Create) become null
    for obj in (MPI.INT, MPI.SUM, MPI.GROUP_EMPTY, MPI.INFO_ENV, MPI.MESSAGE_NO_PROC,
                MPI.COMM_SELF):
        obj.free()
        assert obj
        clone = type(obj)(obj)
        clone.free()
        assert not clone and obj
    op = MPI.Op.Create(lambda a, b: None)
    op.free()
    assert not op and op == MPI.OP_NULL
    MPI.Win.Create(MPI.BOTTOM).free()


def test_subclass_copies_pickle_to_their_class():
    # MPICH: pickle/copy of MyX(X_NULL) (and MyStatus) gives a MyX
    for obj in [MPI.Status(), *NULLS, MPI.INT]:
        cls = type(f"My{type(obj).__name__}", (type(obj),), {"__module__": __name__})
        globals()[cls.__name__] = cls
        try:
            for dup in (copy.copy(cls(obj)), pickle.loads(pickle.dumps(cls(obj)))):
                assert type(dup) is cls and dup == obj
        finally:
            del globals()[cls.__name__]


def test_info_subclass_creates_its_class():
    # MPICH: MyInfo.Create(), .Dup(), .copy(), Create_env() and unpickling give MyInfo
    class MyInfo(MPI.Info):
        pass

    info = MyInfo.Create([("a", "1")])
    for other in (info.Dup(), info.copy(), MyInfo.Create_env()):
        assert type(other) is MyInfo
    globals()["MyInfo"] = MyInfo
    MyInfo.__qualname__ = "MyInfo"
    try:
        back = pickle.loads(pickle.dumps(info))
        assert type(back) is MyInfo and back.items() == [("a", "1")]
    finally:
        del globals()["MyInfo"]


def test_sizeof_addressof_handleof_and_bottom():
    # MPICH: _sizeof 4 for handles, 8 for File, 20 for Status; TypeError for None;
    # int(MPI.BOTTOM) == 0 == MPI.Get_address(None)
    assert MPI._sizeof(MPI.COMM_NULL) == MPI._sizeof(MPI.Comm) == 4
    assert MPI._sizeof(MPI.File) == 8 and MPI._sizeof(MPI.Status()) == 20
    st = MPI.Status()
    assert MPI._addressof(st) == MPI._handleof(st) != 0
    assert MPI._handleof(MPI.INT) == MPI.INT.handle
    for fn in (MPI._sizeof, MPI._addressof, MPI._handleof):
        with pytest.raises(TypeError):
            fn(None)
    assert int(MPI.BOTTOM) == 0 == MPI.Get_address(None) and MPI.BOTTOM == 0
    assert pickle.loads(pickle.dumps(MPI.BOTTOM)) is MPI.BOTTOM
