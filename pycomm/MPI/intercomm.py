"""``MPI.Intercomm``: the class exists so that programs can name it; pycomm offers no
inter-communicators, so every ``Intercomm`` is null.

``Intercomm()`` is a null inter-communicator (equal to ``COMM_NULL``), which is also what
``Comm.Get_parent()`` gives (no pycomm process is spawned). Its calls raise
``MPI.Exception`` (``ERR_COMM``) as any null communicator's; creating one from an
intra-communicator is a ``TypeError``, as in mpi4py, and ``Intracomm.Create_intercomm``
raises ``NotImplementedError``.
"""

from __future__ import annotations

from .comm import Comm
from .exceptions import translate_methods

__all__ = ["Intercomm"]


@translate_methods
class Intercomm(Comm):
    """An inter-communicator (mpi4py's ``MPI.Intercomm``); only the null one exists."""

    __slots__ = ()

    def __init__(self, comm: Comm | None = None):
        super().__init__(comm)
        if self._c is not None:
            raise TypeError("MPI.Intercomm(comm): expecting an intercommunicator "
                            "(pycomm offers none)")

    def Get_remote_group(self):
        self._inner("Get_remote_group")
        raise NotImplementedError("Intercomm.Get_remote_group: pycomm offers no "
                                  "inter-communicators")

    def Get_remote_size(self) -> int:
        self._inner("Get_remote_size")
        raise NotImplementedError("Intercomm.Get_remote_size: pycomm offers no "
                                  "inter-communicators")

    remote_group = property(Get_remote_group)
    remote_size = property(Get_remote_size)

    def Merge(self, high: bool = False):
        self._inner("Merge")
        raise NotImplementedError("Intercomm.Merge: pycomm offers no inter-communicators")
