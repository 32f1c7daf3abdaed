"""pycomm.MPI handles: mpi4py's ``handle``/``fromhandle``/``toint``/``py2f`` and the
pickling of predefined communicators and groups (no world needed)."""

from __future__ import annotations

import pickle

import pytest

from pycomm import MPI


def test_handles_and_pickling_of_predefined_handles():
    # mpi4py's handle conversions: handle/fromhandle round-trip, and the process-local
    # integer handles are the same integer (tests/test_mpi_objmodel.py checks more)
    t = MPI.INT.Dup()
    for obj, cls in ((MPI.GROUP_EMPTY, MPI.Group), (t, MPI.Datatype), (MPI.SUM, MPI.Op),
                     (MPI.REQUEST_NULL, MPI.Request), (MPI.MESSAGE_NULL, MPI.Message)):
        assert cls.fromhandle(obj.handle) == obj and obj.toint() == obj.py2f() == obj.handle
    assert MPI.Comm.f2py(0) == MPI.COMM_NULL
    # predefined communicators and groups unpickle to themselves, copies to equal copies,
    # anything else is refused
    assert pickle.loads(pickle.dumps(MPI.COMM_NULL)) is MPI.COMM_NULL
    copy = pickle.loads(pickle.dumps(MPI.Comm(MPI.COMM_NULL)))
    assert copy == MPI.COMM_NULL and copy is not MPI.COMM_NULL
    assert pickle.loads(pickle.dumps(MPI.GROUP_EMPTY)) is MPI.GROUP_EMPTY
    with pytest.raises(ValueError, match="cannot pickle"):
        pickle.dumps(MPI.Group(MPI.GROUP_EMPTY).Incl([]).Union(MPI.COMM_SELF.Get_group()))


def test_errhandler_null_is_err_errhandler():
    for call in (MPI.ERRHANDLER_NULL.Free,
                 lambda: MPI.COMM_SELF.Set_errhandler(MPI.ERRHANDLER_NULL)):
        with pytest.raises(MPI.Exception) as err:
            call()
        assert err.value.Get_error_class() == MPI.ERR_ERRHANDLER
    assert MPI.Get_error_string(MPI.ERR_SESSION).startswith("MPI_ERR_SESSION")
    MPI.COMM_SELF.Set_errhandler(MPI.ERRORS_RETURN)


def test_waitall_extends_a_short_status_list():
    statuses: list = []
    assert MPI.Request.Waitall([MPI.Request()] * 3, statuses) is True
    assert len(statuses) == 3 and all(isinstance(s, MPI.Status) for s in statuses)
    more = [MPI.Status()]
    assert MPI.Request.Testall([MPI.Request()] * 2, more) and len(more) == 2


def test_comm_constructor_and_null_name():
    with pytest.raises(TypeError, match="expected a communicator"):
        MPI.Comm((1, 2, 3))
    assert MPI.COMM_NULL.Get_name() == "MPI_COMM_NULL"


def test_status_copies_only_a_status():
    st = MPI.Status()
    st.source, st.tag = 3, 4
    assert MPI.Status(st).Get_source() == 3
    with pytest.raises(TypeError, match="expected a Status"):
        MPI.Status(123)
