"""Error handlers (pycomm/MPI/errhandlers.py) in one process, against what mpi4py 4.1.2 +
MPICH 5.0.2 do for the same calls (recorded on this machine): a user-defined handler gets
the errors of calls on its object and the call returns None; ``Call_errhandler`` runs the
handler (nothing for ERRORS_RETURN); ``Get_errhandler`` gives a new handle whose ``Free``
nulls only itself; predefined handlers pickle to themselves and user ones not at all; a
handler of another kind is ERR_ARG. mpi4py's test_errhandler.py passes for Comm, Win and
Session under ``launch.py --mpi4py``.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from pycomm import MPI


def test_a_user_handler_gets_the_errors_of_its_communicator_and_the_call_returns():
    comm = MPI.COMM_SELF.Dup()
    seen = []
    eh = MPI.Comm.Create_errhandler(lambda obj, code: seen.append((obj == comm, code)))
    assert eh and eh != MPI.ERRORS_RETURN
    assert comm.Get_errhandler() == MPI.ERRORS_RETURN      # mpi4py's default
    comm.Set_errhandler(eh)
    got = comm.Get_errhandler()
    assert got == eh and got is not eh
    assert comm.Call_errhandler(MPI.ERR_OTHER) is None
    assert comm.Call_errhandler(MPI.SUCCESS) is None
    assert comm.Send(b"x", dest=5) is None                  # an invalid rank: no exception
    assert comm.Get_attr(123) is None                       # an invalid key: no exception
    assert seen == [(True, MPI.ERR_OTHER), (True, MPI.SUCCESS), (True, MPI.ERR_RANK),
                    (True, MPI.ERR_KEYVAL)]
    dup = comm.Dup()                                        # MPI_Comm_dup keeps it
    assert dup.Get_errhandler() == eh
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    comm.Call_errhandler(MPI.ERR_OTHER)                     # ERRORS_RETURN: nothing
    with pytest.raises(MPI.Exception) as err:
        comm.Send(b"x", dest=5)
    assert err.value.Get_error_class() == MPI.ERR_RANK
    for c in (dup, comm):
        c.Free()
    eh.Free()


def test_handles_copies_free_and_pickling():
    comm = MPI.COMM_SELF.Dup()
    copies = [comm.Get_errhandler() for _ in range(3)]
    for e in copies:
        e.Free()
        assert e == MPI.ERRHANDLER_NULL and not e
    assert comm.Get_errhandler() == MPI.ERRORS_RETURN        # the object's is untouched
    MPI.ERRORS_RETURN.Free()                                 # a predefined constant stays
    assert MPI.ERRORS_RETURN and MPI.ERRORS_RETURN != MPI.ERRHANDLER_NULL
    with pytest.raises(MPI.Exception) as err:
        MPI.ERRHANDLER_NULL.Free()
    assert err.value.Get_error_class() == MPI.ERR_ERRHANDLER
    for eh in (MPI.ERRORS_ARE_FATAL, MPI.ERRORS_RETURN, MPI.ERRORS_ABORT):
        assert pickle.loads(pickle.dumps(eh)) is eh
        copy = pickle.loads(pickle.dumps(MPI.Errhandler(eh)))
        assert copy == eh and copy is not eh
    user = MPI.Comm.Create_errhandler(lambda obj, code: None)
    try:
        with pytest.raises(ValueError, match="user-defined"):     # mpi4py: ValueError
            pickle.dumps(user)
    finally:
        user.Free()
    comm.Free()


def test_bad_handlers_are_refused_before_anything_changes():
    comm = MPI.COMM_SELF.Dup()
    win_eh = MPI.Win.Create_errhandler(lambda obj, code: None)
    cases = [(lambda: comm.Set_errhandler(MPI.ERRHANDLER_NULL), MPI.ERR_ERRHANDLER),
             (lambda: comm.Set_errhandler(win_eh), MPI.ERR_ARG)]
    for call, code in cases:
        with pytest.raises(MPI.Exception) as err:
            call()
        assert err.value.Get_error_class() == code
    with pytest.raises(TypeError, match="must be an MPI.Errhandler"):
        comm.Set_errhandler(5)
    with pytest.raises(TypeError, match="must be callable"):
        MPI.Comm.Create_errhandler(5)
    assert comm.Get_errhandler() == MPI.ERRORS_RETURN
    win_eh.Free()
    comm.Free()


def test_at_most_32_user_handlers_of_a_kind_are_alive():
    from pycomm.MPI import errhandlers
    alive = errhandlers._LIVE.get("Comm", 0)         # this process's others, if any
    made = [MPI.Comm.Create_errhandler(lambda obj, code: None) for _ in range(32 - alive)]
    with pytest.raises(RuntimeError, match="too many user-defined error handlers"):
        MPI.Comm.Create_errhandler(lambda obj, code: None)
    session_eh = MPI.Session.Create_errhandler(lambda obj, code: None)   # another kind
    made.pop().Free()
    made.append(MPI.Comm.Create_errhandler(lambda obj, code: None))     # a slot is free
    for eh in made + [session_eh]:
        eh.Free()


def test_window_and_session_handlers():
    seen = []
    win = MPI.Win.Allocate(8, comm=MPI.COMM_SELF)
    eh = MPI.Win.Create_errhandler(lambda obj, code: seen.append((obj == win, code)))
    win.Set_errhandler(eh)
    win.Call_errhandler(MPI.ERR_OTHER)
    assert win.Get_attr(MPI.KEYVAL_INVALID) is None         # handled, not raised
    assert seen == [(True, MPI.ERR_OTHER), (True, MPI.ERR_KEYVAL)]
    win.Free()
    session = MPI.Session.Init()
    session.Set_errhandler(MPI.ERRORS_RETURN)
    session.Call_errhandler(MPI.ERR_OTHER)
    assert session.Get_errhandler() == MPI.ERRORS_RETURN
    session.Finalize()
    eh.Free()


def test_file_handlers(tmp_path):
    seen = []
    path = tmp_path / "f"
    path.write_bytes(b"")
    f = MPI.File.Open(MPI.COMM_SELF, str(path), MPI.MODE_RDONLY)
    eh = MPI.File.Create_errhandler(lambda obj, code: seen.append((obj == f, code)))
    f.Set_errhandler(eh)
    assert f.Get_errhandler() == eh
    assert f.Write(b"x") is None                            # read-only: handled
    f.Call_errhandler(MPI.ERR_OTHER)
    assert seen == [(True, MPI.ERR_READ_ONLY), (True, MPI.ERR_OTHER)]
    f.Close()
    with pytest.raises(MPI.Exception) as err:
        MPI.FILE_NULL.Set_errhandler(MPI.Comm.Create_errhandler(lambda obj, code: None))
    assert err.value.Get_error_class() == MPI.ERR_ARG
    eh.Free()


@pytest.mark.parametrize("handler", ["ERRORS_ARE_FATAL", "ERRORS_ABORT"])
def test_calling_a_fatal_handler_ends_the_job_with_the_code(handler):
    program = ("from pycomm import MPI\n"
               f"MPI.COMM_SELF.Set_errhandler(MPI.{handler})\n"
               "MPI.COMM_SELF.Call_errhandler(MPI.ERR_OTHER)\n"
               "print('not reached')\n")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == MPI.ERR_OTHER, proc.stderr
    assert f"MPI_{handler} called on Intracomm with error {MPI.ERR_OTHER}" in proc.stderr
    assert proc.stdout == ""
