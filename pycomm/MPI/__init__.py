"""``pycomm.MPI``: a module shaped like ``mpi4py.MPI``, a thin façade over pycomm.

``from pycomm import MPI`` (or, under ``launch.py --mpi4py``, ``from mpi4py import MPI``)
gives mpi4py's names: ``MPI.COMM_WORLD`` (an :class:`Intracomm` over
``pycomm.COMM_WORLD``, created on first use, as ``pycomm.init()``), ``COMM_SELF``,
``COMM_NULL``, the predefined datatypes (``MPI.DOUBLE``...) and derived-type
constructors, message specs (``[buf, count, MPI.FLOAT]``...), ops, ``Status``,
``Request``, ``Group``, ``Cartcomm``, the environment functions (``Init``, ``Finalize``,
``Wtime``, ``Get_processor_name``...) and ``MPI.Exception`` with the ``ERR_*`` classes.

Every collective runs in :class:`pycomm.comm.Communicator`; this package only maps names,
signatures and message specs onto it (see :mod:`pycomm.MPI.comm`). What MPI has and pycomm
does not offer (dynamic processes, ports) raises ``NotImplementedError`` naming
the feature. One-sided windows (``MPI.Win``) are shared memory, for ranks on one host
(:mod:`pycomm.MPI.win`); files (``MPI.File``, MPI-IO) need a shared POSIX file system
(:mod:`pycomm.MPI.file`).
"""

# ruff: noqa: F401  (this module re-exports the names of its submodules, as mpi4py.MPI)

from __future__ import annotations

import os as _os
import socket as _socket
import threading as _threading

import pycomm as _pycomm
from pycomm.buffers import IN_PLACE
from pycomm.errors import ArgumentError
from pycomm.groups import UNDEFINED
from pycomm.p2p import ANY_SOURCE, ANY_TAG, PROC_NULL

from . import datatypes as _datatypes
from . import exitnote as _exitnote
from . import external32 as _external32
from .coll import Intracomm
from .comm import (
    CONGRUENT,
    IDENT,
    KEYVAL_APPNUM,
    KEYVAL_HOST,
    KEYVAL_IO,
    KEYVAL_LASTUSEDCODE,
    KEYVAL_TAG_UB,
    KEYVAL_UNIVERSE_SIZE,
    KEYVAL_WTIME_IS_GLOBAL,
    SIMILAR,
    UNEQUAL,
    Comm,
)
from .datatypes import (
    COMBINER_NAMED,
    DATATYPE_NULL,
    ORDER_C,
    ORDER_F,
    ORDER_FORTRAN,
    Datatype,
)
from .exceptions import (
    ERRORS,
    Add_error_class,
    Add_error_code,
    Add_error_string,
    Exception,
    Get_error_class,
    Get_error_string,
    Remove_error_class,
    Remove_error_code,
    Remove_error_string,
    mpi_error,
)
from .grequest import Grequest
from .groups import GROUP_EMPTY, GROUP_NULL, Group
from .info import INFO_ENV, INFO_NULL, KEYVAL_INVALID, Info
from .intercomm import Intercomm
from .membuf import BSEND, BUFFER_AUTOMATIC, Alloc_mem, Free_mem, buffer, memory
from .message import MESSAGE_NO_PROC, MESSAGE_NULL, Message
from .msgspec import BOTTOM
from .graph import Graphcomm
from .neighbor import UNWEIGHTED, WEIGHTS_EMPTY, Distgraphcomm, Topocomm
from .objects import comm_lock as _comm_lock
from .objects import comm_lock_table as _comm_lock_table
from . import pickler as _pickler
from .pickler import Pickle, pickle
from .ops import (
    BAND,
    BOR,
    BXOR,
    LAND,
    LOR,
    LXOR,
    MAX,
    MAXLOC,
    MIN,
    MINLOC,
    NO_OP,
    OP_NULL,
    PROD,
    REPLACE,
    SUM,
    Op,
)
from .predefined import PREDEFINED
from .predefined import TYPEDICT as _typedict, TYPEDICT_C as _typedict_c
from .predefined import TYPEDICT_F as _typedict_f, typecode as _typecode
from .typequery import typealign as _typealign
from .prequest import Prequest
from .request import REQUEST_NULL, Request, Status, completed
from .win import WIN_NULL, Win
from .file import (DISPLACEMENT_CURRENT, FILE_NULL, MODE_APPEND, MODE_CREATE,
                   MODE_DELETE_ON_CLOSE, MODE_EXCL, MODE_RDONLY, MODE_RDWR, MODE_SEQUENTIAL,
                   MODE_UNIQUE_OPEN, MODE_WRONLY, SEEK_CUR, SEEK_END, SEEK_SET, File,
                   Register_datarep)
from . import errhandlers as _errhandlers
from . import keyvals as _keyvals
from . import surface as _surface
from .session import SESSION_NULL, Session
from . import handles as _handles
from . import objmodel as _objmodel
from . import pickling as _pickling
from .topo import CART, DIST_GRAPH, GRAPH, Cartcomm, Compute_dims

# -- datatypes (MPI.DOUBLE ...) and error classes (MPI.ERR_TRUNCATE ...) ----------------
globals().update({name: dt for name, dt in PREDEFINED.items() if name.isidentifier()})
globals().update(ERRORS)
globals().update({k: v for k, v in vars(_datatypes).items()
                  if k.startswith(("COMBINER_", "TYPECLASS_"))})

# -- constants --------------------------------------------------------------------------
ROOT = -3
TAG_UB, HOST, IO, WTIME_IS_GLOBAL = KEYVAL_TAG_UB, KEYVAL_HOST, KEYVAL_IO, \
    KEYVAL_WTIME_IS_GLOBAL
UNIVERSE_SIZE, APPNUM, LASTUSEDCODE = KEYVAL_UNIVERSE_SIZE, KEYVAL_APPNUM, \
    KEYVAL_LASTUSEDCODE
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
MAX_PROCESSOR_NAME = 256
MAX_ERROR_STRING = 512
MAX_OBJECT_NAME = 128
MAX_LIBRARY_VERSION_STRING = 8192
MAX_INFO_KEY, MAX_INFO_VAL = 255, 1024
BSEND_OVERHEAD = 96          # bytes per message MPI says to add when sizing Attach_buffer
VERSION, SUBVERSION = 4, 1
DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC, DISTRIBUTE_NONE = 121, 122, 123
DISTRIBUTE_DFLT_DARG = -49767
# one-sided and Fortran constants (MPICH's values; the I/O ones are pycomm.MPI.file's)
LOCK_EXCLUSIVE, LOCK_SHARED = 234, 235
MODE_NOCHECK, MODE_NOSTORE, MODE_NOPUT, MODE_NOPRECEDE, MODE_NOSUCCEED = \
    1024, 2048, 4096, 8192, 16384
DISP_CUR = DISPLACEMENT_CURRENT
WIN_BASE, WIN_SIZE, WIN_DISP_UNIT, WIN_CREATE_FLAVOR, WIN_MODEL = \
    1711276033, 1711276035, 1711276037, 1711276039, 1711276041
WIN_FLAVOR = WIN_CREATE_FLAVOR
WIN_FLAVOR_CREATE, WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_DYNAMIC, WIN_FLAVOR_SHARED = 1, 2, 3, 4
WIN_SEPARATE, WIN_UNIFIED = 1, 2
F_SOURCE, F_TAG, F_ERROR, F_STATUS_SIZE = 2, 3, 4, 5
MAX_PORT_NAME, MAX_DATAREP_STRING, MAX_PSET_NAME_LEN, MAX_STRINGTAG_LEN = 1024, 128, 256, 256



from .errhandlers import (ERRHANDLER_NULL, ERRORS_ABORT, ERRORS_ARE_FATAL, ERRORS_RETURN,
                          Errhandler)





# -- environment ------------------------------------------------------------------------
_state = {"thread_level": THREAD_SERIALIZED, "finalized": False, "errors": "exception"}
_main_thread = _threading.main_thread()
COMM_NULL = Comm()


def _configure(options: dict) -> None:
    """Take ``mpi4py.rc``'s options (:func:`pycomm.MPI.rcopts.read`) and the pickle
    environment (``MPI4PY_PICKLE_PROTOCOL``/``_THRESHOLD``) as ``import mpi4py.MPI`` does."""
    _state["errors"] = options["errors"]
    _pickler.configure(*(int(v) if v is not None else None for v in (
        _os.environ.get("MPI4PY_PICKLE_PROTOCOL"), _os.environ.get("MPI4PY_PICKLE_THRESHOLD"))))


def _set_abort_status(status: int) -> None:
    """``python -m mpi4py``'s helper: the program ended with an uncaught exception (or a
    non-zero exit); at exit, ``COMM_WORLD.Abort(status)`` ends the job, as mpi4py does."""
    import atexit
    if not _state.get("abort_status"):
        atexit.register(_abort_at_exit)
    _state["abort_status"] = int(status)


def _abort_at_exit() -> None:
    if _pycomm.is_initialized() and not _state["finalized"]:
        __getattr__("COMM_WORLD").Abort(_state["abort_status"])     # made on first use


def default_errhandler() -> Errhandler:
    """The handler an object reports until one is set, by ``mpi4py.rc.errors``."""
    return {"exception": ERRORS_RETURN, "abort": ERRORS_ABORT}.get(_state["errors"],
                                                                   ERRORS_ARE_FATAL)


def Init() -> None:
    """Create the world (``pycomm.init()``): connects to the launcher's rendezvous."""
    _pycomm.init()
    _exitnote.arm()


def Init_thread(required: int = THREAD_MULTIPLE) -> int:
    """Init, and return the thread level provided: ``THREAD_SERIALIZED`` at most.

    One thread of a rank at a time may call pycomm (its own progress thread is internal).
    A thread that calls it while another thread of the rank waits in a blocking call gets
    ``MPI.Exception`` (class ``ERR_OTHER``, a :class:`pycomm.errors.ThreadLevelError`)
    at once, naming both threads and both calls; the waiting call goes on.

    Args:
        required: the thread level asked for (``THREAD_MULTIPLE``, mpi4py's default).

    Returns:
        int: ``min(required, THREAD_SERIALIZED)``.

    Raises:
        CommError: the world cannot be created (see ``pycomm.init``).
    """
    _pycomm.init()
    _exitnote.arm()
    _state["thread_level"] = min(int(required), THREAD_SERIALIZED)
    return _state["thread_level"]


def Query_thread() -> int:
    """The thread level provided (``THREAD_SERIALIZED`` unless ``Init_thread`` asked less;
    see :func:`Init_thread` for what a second thread gets).

    Returns:
        int: ``THREAD_SINGLE`` .. ``THREAD_SERIALIZED``.
    """
    return _state["thread_level"]


def Is_thread_main() -> bool:
    return _threading.current_thread() is _main_thread


def Finalize() -> None:
    """Release the world (``pycomm.finalize()``); pending Bsends are flushed first."""
    if _pycomm.is_initialized():
        BSEND.drain()
    _pycomm.finalize()
    _state["finalized"] = True


def Is_initialized() -> bool:
    """Whether the world exists (Init, or a first use of COMM_WORLD, created it)."""
    return _pycomm.is_initialized() or _state["finalized"]


def Is_finalized() -> bool:
    return _state["finalized"]


def Get_version() -> tuple[int, int]:
    """The MPI standard version whose names pycomm.MPI follows: ``(4, 1)``."""
    return VERSION, SUBVERSION


def Get_library_version() -> str:
    return (f"pycomm {_pycomm.__version__} (pure-Python collective communication; "
            f"mpi4py-compatible façade pycomm.MPI, MPI {VERSION}.{SUBVERSION} names)")


def get_vendor() -> tuple[str, tuple[int, int, int]]:
    """``("pycomm", (major, minor, micro))``: the "MPI implementation" underneath."""
    return "pycomm", tuple(int(x) for x in _pycomm.__version__.split(".")[:3])


def Get_processor_name() -> str:
    """This host's name (at most ``MAX_PROCESSOR_NAME`` characters)."""
    return _socket.gethostname()[:MAX_PROCESSOR_NAME]


def Get_hw_resource_info() -> Info:
    """Hardware hints: none (an empty info object)."""
    return Info.Create()


Wtime = _pycomm.Wtime
Wtick = _pycomm.Wtick


def Pcontrol(level: int) -> None:
    """Profiling control: pycomm has no profiling layer; accepted and ignored."""


def Attach_buffer(buf) -> None:
    """Attach a buffer for ``Bsend`` (pycomm copies each buffered message privately, so
    the buffer is only kept to be handed back by :func:`Detach_buffer`; None or
    ``BUFFER_AUTOMATIC``: automatic)."""
    BSEND.attach(buf)


def Detach_buffer():
    """Wait for every pending buffered send; return the attached buffer."""
    return BSEND.detach()


def Flush_buffer() -> None:
    """Wait for the pending buffered sends (MPI 4.1)."""
    BSEND.drain()


def Iflush_buffer() -> Request:
    """:func:`Flush_buffer`, complete when it returns."""
    BSEND.drain()
    return completed(__getattr__("COMM_WORLD")._inner("Iflush_buffer")._engine)


COMM_TYPE_SHARED, COMM_TYPE_HW_GUIDED, COMM_TYPE_HW_UNGUIDED, COMM_TYPE_RESOURCE_GUIDED = \
    1, 2, 3, 4


def Get_address(location) -> int:
    """The memory address of a buffer (its first byte); 0 for ``BOTTOM`` and None (as
    mpi4py on MPICH)."""
    import numpy as np
    if location is BOTTOM or location is None:
        return 0
    return int(np.frombuffer(memoryview(location).cast("B"), np.uint8)
               .__array_interface__["data"][0])


def Aint_add(base: int, disp: int) -> int:
    return int(base) + int(disp)


def Aint_diff(addr1: int, addr2: int) -> int:
    return int(addr1) - int(addr2)


def _world() -> Intracomm:
    out = Intracomm._wrap(_pycomm.init())
    _exitnote.arm()
    out._name = "MPI_COMM_WORLD"
    return out


def _self() -> Intracomm:
    world = _pycomm.init()
    inner = world.Create_group(world.Get_group().Incl([world.rank]))
    out = Intracomm._wrap(inner)
    out._name = "MPI_COMM_SELF"
    return out


_LAZY = {"COMM_WORLD": _world, "COMM_SELF": _self}
_NOT_OFFERED = {
    "Get_abi_info": "MPI ABI queries", "Get_abi_fortran_info": "MPI ABI queries",
}


def Open_port(info=None) -> str:
    """A new port served by this process, for ``Intracomm.Accept`` (MPI_Open_port; see
    :mod:`pycomm.MPI.ports`). Returns its name."""
    from .ports import open_port
    return open_port()


def Close_port(port_name: str) -> None:
    """Refuse new connections on ``port_name`` (MPI_Close_port).

    Raises:
        MPI.Exception: ERR_PORT (not a port this process has open).
    """
    from .ports import close_port
    close_port(port_name)


def Publish_name(service_name: str, port_name: str, info=None) -> None:
    """Publish ``port_name`` as ``service_name`` on this host (MPI_Publish_name).

    Raises:
        MPI.Exception: ERR_SERVICE (published already).
    """
    from .ports import publish_name
    publish_name(service_name, port_name)


def Lookup_name(service_name: str, info=None) -> str:
    """The port published as ``service_name`` on this host (MPI_Lookup_name).

    Raises:
        MPI.Exception: ERR_NAME (nothing published so).
    """
    from .ports import lookup_name
    return lookup_name(service_name)


def Unpublish_name(service_name: str, port_name: str, info=None) -> None:
    """Withdraw ``service_name`` (MPI_Unpublish_name).

    Raises:
        MPI.Exception: ERR_SERVICE (not published with ``port_name``).
    """
    from .ports import unpublish_name
    unpublish_name(service_name, port_name)


BottomType, InPlaceType, BufferAutomaticType = \
    type(BOTTOM), type(IN_PLACE), type(BUFFER_AUTOMATIC)
globals().update({f"SINT{n}_T": PREDEFINED[f"INT{n}_T"] for n in (8, 16, 32, 64)})


def Get_abi_version() -> tuple[int, int]:
    """``(-1, -1)``: pycomm implements no MPI ABI (as mpi4py reports for MPICH)."""
    return -1, -1


_keyvals.install({"Comm": Comm, "Datatype": Datatype, "Win": Win})
_external32.install(Datatype)
_errhandlers.install({"Comm": Comm, "Win": Win, "Session": Session, "File": File})
_surface.install(globals())
_objmodel.install(globals())
_handles.install(globals())
_pickling.install(globals())
_sizeof, _addressof, _handleof = _objmodel.sizeof, _objmodel.addressof, _objmodel.handleof


def __getattr__(name: str):
    make = _LAZY.get(name)
    if make is not None:
        value = make()
        globals()[name] = value      # later lookups are plain attribute reads
        _objmodel.add_constant(value)
        return value
    if name in _NOT_OFFERED:
        raise NotImplementedError(f"MPI.{name}: pycomm does not offer "
                                  f"{_NOT_OFFERED[name]}")
    raise AttributeError(f"module 'pycomm.MPI' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
