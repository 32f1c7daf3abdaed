"""``MPI.File``: MPI-IO (MPI-4.1 chapter 14) for ranks that share a POSIX file system.

A file is opened by every rank of an intra-communicator (``File.Open``, collective,
14.2.1); each rank then holds its own descriptor of it and moves its own bytes with
``pread``/``pwrite`` through its *view* (:mod:`pycomm.MPI.fileview`, 14.3). The data
access calls are :mod:`pycomm.MPI.fileaccess`'s, group, hints, atomicity and error
handlers :mod:`pycomm.MPI.fileattrs`'s; the system calls, locks and the shared file
pointer are :mod:`pycomm.MPI.fileio`'s. The file keeps a duplicate of the communicator,
so its collective steps never meet the program's messages.

Collective calls agree through that communicator before anything changes, so every rank
gets the same outcome: ``Open`` (same ``amode`` everywhere, else ``ERR_NOT_SAME``; one
rank creates the file, then the others open it, and any rank's failure is every rank's
error), ``Set_size``/``Preallocate`` (one rank changes the size after every rank
arrived), ``Set_view`` and ``Seek_shared`` (one rank resets or moves the shared pointer
after every rank arrived), ``Set_atomicity``, ``Close`` (with ``MODE_DELETE_ON_CLOSE``,
one rank deletes after every rank closed).

Error classes (14.7): a bad ``amode`` (not exactly one of ``MODE_RDONLY``,
``MODE_WRONLY``, ``MODE_RDWR``; ``MODE_RDONLY`` with ``MODE_CREATE`` or ``MODE_EXCL``;
``MODE_RDWR`` with ``MODE_SEQUENTIAL``) is ``ERR_AMODE``; a missing file
``ERR_NO_SUCH_FILE``; ``MODE_CREATE | MODE_EXCL`` on an existing one ``ERR_FILE_EXISTS``;
no permission ``ERR_ACCESS``; writing a ``MODE_RDONLY`` file ``ERR_READ_ONLY``; reading
a ``MODE_WRONLY`` one ``ERR_ACCESS``; explicit offsets or individual pointers on a
``MODE_SEQUENTIAL`` file ``ERR_UNSUPPORTED_OPERATION``; a null or closed file
``ERR_FILE``. Each is raised before any byte moves, naming the call and the argument.

Data representations (14.5): ``"native"`` (and ``"internal"``, the same bytes here);
``"external32"`` and representations made with :func:`Register_datarep` (which records
the name, so a second registration is ``ERR_DUP_DATAREP``) are refused by ``Set_view``
with ``ERR_UNSUPPORTED_DATAREP``: pycomm converts no data.
"""

from __future__ import annotations

import os
import socket
import uuid

from pycomm.errors import ArgumentError, CommError

from .exceptions import ERRORS, mpi_error, translate_methods
from .fileaccess import DataAccess
from .fileattrs import DATAREPS, NATIVE, NULL_STATE, FileAttributes, Register_datarep
from .fileio import FilePointer, LocalPointer, os_error
from .fileview import View
from .info import Info
from .msgspec import as_int
from .predefined import PREDEFINED

__all__ = ["DISPLACEMENT_CURRENT", "FILE_NULL", "File", "Register_datarep"]

MODE_CREATE, MODE_RDONLY, MODE_WRONLY, MODE_RDWR, MODE_DELETE_ON_CLOSE = 1, 2, 4, 8, 16
MODE_UNIQUE_OPEN, MODE_EXCL, MODE_APPEND, MODE_SEQUENTIAL = 32, 64, 128, 256
SEEK_SET, SEEK_CUR, SEEK_END = 600, 602, 604
DISPLACEMENT_CURRENT = -54278278
_ALL_MODES = 511


def _path(filename, where: str) -> str:
    try:
        return os.fsdecode(os.fspath(filename))
    except TypeError:
        raise TypeError(f"{where}: filename must be a str, bytes or os.PathLike, got "
                        f"{type(filename).__name__}") from None


def _check_amode(amode: int, where: str) -> None:
    """Raise ERR_AMODE for what 14.2.1 calls erroneous."""
    access = [m for m in (MODE_RDONLY, MODE_WRONLY, MODE_RDWR) if amode & m]
    why = None
    if amode & ~_ALL_MODES or amode < 0:
        why = "has bits that are no MODE_* constant"
    elif len(access) != 1:
        why = "must hold exactly one of MODE_RDONLY, MODE_WRONLY, MODE_RDWR"
    elif amode & MODE_RDONLY and amode & (MODE_CREATE | MODE_EXCL):
        why = "MODE_RDONLY with MODE_CREATE or MODE_EXCL"
    elif amode & MODE_RDWR and amode & MODE_SEQUENTIAL:
        why = "MODE_RDWR with MODE_SEQUENTIAL"
    if why:
        raise mpi_error(ArgumentError, "ERR_AMODE", f"{where}: amode={amode}: {why}")


def _flags(amode: int, create: bool) -> int:
    flags = {MODE_RDONLY: os.O_RDONLY, MODE_WRONLY: os.O_WRONLY}.get(
        amode & (MODE_RDONLY | MODE_WRONLY), os.O_RDWR)
    if create and amode & MODE_CREATE:
        flags |= os.O_CREAT | (os.O_EXCL if amode & MODE_EXCL else 0)
    return flags | getattr(os, "O_CLOEXEC", 0)


def _failure(exc: BaseException) -> tuple[str, str]:
    """An error as ``(MPI class name, message)``, to travel to the other ranks."""
    names = {v: k for k, v in ERRORS.items()}
    return names.get(getattr(exc, "error_code", None), "ERR_IO"), str(exc)


def _raise_first(failures) -> None:
    """Raise the first failure of the per-rank list (None: that rank succeeded)."""
    for r, f in enumerate(failures):
        if f is not None:
            code, text = f
            who = "" if len(failures) == 1 else f"rank {r}: "
            raise mpi_error(CommError, code, f"{who}{text}")


def _shared_path(path: str, one_host: bool) -> str:
    """A new name for the shared pointer's file (see :mod:`pycomm.MPI.fileio`)."""
    tag = uuid.uuid4().hex[:16]
    if one_host and os.path.isdir("/dev/shm"):
        import pycomm     # a job-prefixed name: the launcher sweeps it after a crash
        job = getattr(pycomm.init()._engine, "job_id", None) or f"p{os.getpid()}"
        return f"/dev/shm/pycomm-{job}-file-{tag}"
    head, tail = os.path.split(os.path.abspath(path))
    return os.path.join(head, f".{tail}.pycomm-sfp-{tag}")


class _State:
    """One open file: what every handle of it (``File(fh)`` copies) shares."""

    def __init__(self, comm, fd: int, path: str, amode: int, shared, info: dict):
        self.comm, self.fd, self.path, self.amode = comm, fd, path, amode
        self.shared, self.info, self.closed = shared, info, False
        byte = PREDEFINED["BYTE"]
        self.view = View(0, byte, byte, "native")
        self.pos = 0                        # the individual file pointer, in etypes
        self.atomic = False
        self.split = None                   # a split collective begun: (begin, bytes, buf)
        self.errhandler = NULL_STATE["errhandler"]


@translate_methods
class File(DataAccess, FileAttributes):
    """An open file (mpi4py's ``MPI.File``); ``File()`` is ``FILE_NULL``, ``File(fh)``
    another handle of ``fh``'s file."""

    def __init__(self, file: File | None = None):
        if file is not None and not isinstance(file, File):
            raise TypeError(f"File({file!r}): expected an MPI.File or nothing")
        self._s = file._s if file is not None else None

    def _state(self, call: str) -> _State:
        s = self._s
        if s is None or s.closed:
            raise mpi_error(ArgumentError, "ERR_FILE", f"File.{call}: the file is "
                         f"{'FILE_NULL' if s is None else 'closed'}")
        return s

    def __eq__(self, other) -> bool:
        if not isinstance(other, File):
            return NotImplemented
        return self._s is other._s

    __hash__ = None                         # as mpi4py's handles: unhashable

    def __bool__(self) -> bool:
        return self._s is not None

    def __reduce__(self):
        if self._s is not None:
            raise ValueError(f"cannot pickle {self!r}: an open file means nothing in "
                             "another process")
        return (_file_null, ()) if self is FILE_NULL else (type(self), ())

    def __repr__(self) -> str:
        return "<MPI.FILE_NULL>" if self._s is None else f"<MPI.File {self._s.path!r}>"

    # -- opening and closing (14.2) -----------------------------------------------------
    @classmethod
    def Open(cls, comm, filename, amode: int = MODE_RDONLY, info=None) -> File:
        """Open ``filename`` on every rank of ``comm`` (collective, MPI-4.1 14.2.1).

        Args:
            comm: an intra-communicator; every rank of it calls Open.
            filename: str, bytes or os.PathLike, the same file on every rank.
            amode: ``MODE_*`` flags or-ed together, the same on every rank.
            info: hints (``Info`` or ``INFO_NULL``), kept for ``Get_info``.

        Returns:
            File: a new handle (its error handler is ``FILE_NULL``'s).

        Raises:
            ArgumentError: MPI.Exception ERR_COMM (not an intra-communicator), ERR_AMODE,
                ERR_NOT_SAME (ranks passed different amodes).
            CommError: MPI.Exception ERR_NO_SUCH_FILE, ERR_FILE_EXISTS, ERR_ACCESS,
                ERR_BAD_FILE, ERR_IO... from any rank, on every rank.
            TypeError: filename or amode of the wrong type.
        """
        from .coll import Intracomm
        where = "File.Open"
        if not isinstance(comm, Intracomm) or not comm:
            raise mpi_error(ArgumentError, "ERR_COMM", f"{where}: comm must be an "
                         f"intra-communicator, got {comm!r}")
        path = _path(filename, where)
        amode = as_int(amode, "amode", where)
        _check_amode(amode, where)
        hints = dict(info.items()) if isinstance(info, Info) and info else {}
        fcomm = comm.Dup()
        fd = shared = None
        try:
            heard = fcomm.allgather((amode, socket.gethostname()))
            if any(a != amode for a, _ in heard):
                raise mpi_error(ArgumentError, "ERR_NOT_SAME", f"{where}: the ranks passed "
                             f"different amodes: {[a for a, _ in heard]}")
            first = spath = None
            if fcomm.rank == 0:             # creates the file (and the pointer's file)
                try:
                    fd = os.open(path, _flags(amode, True), 0o666)
                except OSError as exc:
                    first = _failure(os_error(exc, where, path))
                if first is None and fcomm.size > 1:
                    spath = _shared_path(path, len({h for _, h in heard}) == 1)
                    try:
                        FilePointer.create(spath)
                    except OSError:
                        spath = None        # shared-pointer calls will say why
            first, spath = fcomm.bcast((first, spath), 0)
            _raise_first([first])
            mine = None
            try:
                if fd is None:
                    fd = os.open(path, _flags(amode, False))
                shared = FilePointer(spath) if spath else \
                    LocalPointer() if fcomm.size == 1 else None
            except OSError as exc:
                mine = _failure(os_error(exc, where, path))
            failures = fcomm.allgather(mine)
            if fcomm.rank == 0 and spath:   # every rank holds it open: unlink the name
                _unlink(spath)
            _raise_first(failures)
        except BaseException:
            _release(fd, shared)
            fcomm.Free()
            raise
        out = cls.__new__(cls)
        out._s = _State(fcomm, fd, path, amode, shared, hints)
        if amode & MODE_APPEND:             # every pointer starts at the end (14.2.1)
            end = os.fstat(fd).st_size
            out._s.pos = end
            if fcomm.rank == 0 and shared is not None:
                shared.set(end)
            fcomm.Barrier()
        return out

    def Close(self) -> None:
        """Close the file (collective, 14.2.2); with ``MODE_DELETE_ON_CLOSE`` it is
        deleted once every rank closed it. This handle becomes ``FILE_NULL``.

        Returns:
            None.

        Raises:
            ArgumentError: MPI.Exception ERR_FILE (null or closed file).
        """
        s = self._state("Close")
        s.closed = True
        self._s = None
        _release(s.fd, s.shared)
        if s.amode & MODE_DELETE_ON_CLOSE:
            s.comm.Barrier()
            if s.comm.rank == 0:
                _unlink(s.path)
        s.comm.Free()

    @classmethod
    def Delete(cls, filename, info=None) -> None:
        """Delete a file (14.2.3).

        Args:
            filename: str, bytes or os.PathLike.
            info: hints (ignored).

        Returns:
            None.

        Raises:
            CommError: MPI.Exception ERR_NO_SUCH_FILE, ERR_ACCESS, ERR_BAD_FILE, ERR_IO.
            TypeError: filename of the wrong type.
        """
        path = _path(filename, "File.Delete")
        try:
            os.unlink(path)
        except OSError as exc:
            raise os_error(exc, "File.Delete", path) from None

    # -- size (14.2.4-14.2.6) -----------------------------------------------------------
    def _resize(self, size, call: str, grow_only: bool) -> None:
        s, where = self._state(call), f"File.{call}"
        size = as_int(size, "size", where)
        if size < 0:
            raise mpi_error(ArgumentError, "ERR_ARG", f"{where}: size={size} is negative")
        if s.amode & MODE_RDONLY:
            raise mpi_error(ArgumentError, "ERR_READ_ONLY", f"{where}: the file was opened "
                         "MODE_RDONLY")
        sizes = s.comm.allgather(size)
        if len(set(sizes)) > 1:
            raise mpi_error(ArgumentError, "ERR_NOT_SAME", f"{where}: the ranks passed "
                         f"different sizes {sizes}")
        fail = None
        if s.comm.rank == 0:
            try:
                if not grow_only:
                    os.ftruncate(s.fd, size)
                elif size > os.fstat(s.fd).st_size:
                    try:
                        os.posix_fallocate(s.fd, 0, size)
                    except OSError:         # a file system that cannot: extend it
                        os.ftruncate(s.fd, size)
            except OSError as exc:
                fail = _failure(os_error(exc, where, s.path))
        _raise_first([s.comm.bcast(fail, 0)])

    def Set_size(self, size: int) -> None:
        """Truncate or extend the file to ``size`` bytes (collective, 14.2.4).

        Args:
            size: the new size in bytes, the same on every rank.

        Returns:
            None.

        Raises:
            ArgumentError: MPI.Exception ERR_ARG (negative), ERR_NOT_SAME, ERR_READ_ONLY,
                ERR_FILE.
            CommError: MPI.Exception ERR_IO... from the system.
        """
        self._resize(size, "Set_size", False)

    def Preallocate(self, size: int) -> None:
        """Make the file at least ``size`` bytes, storage allocated (collective, 14.2.5).

        Args:
            size: bytes, the same on every rank; a smaller file grows, a larger stays.

        Returns:
            None.

        Raises:
            ArgumentError: as :meth:`Set_size`.
            CommError: MPI.Exception ERR_NO_SPACE, ERR_IO... from the system.
        """
        self._resize(size, "Preallocate", True)

    def Get_size(self) -> int:
        """The file's size in bytes (14.2.6).

        Returns:
            int: bytes.

        Raises:
            ArgumentError: MPI.Exception ERR_FILE.
        """
        s = self._state("Get_size")
        return os.fstat(s.fd).st_size

    size = property(Get_size, doc="The file's size in bytes.")

    def Get_amode(self) -> int:
        """The access mode the file was opened with.

        Returns:
            int: the ``MODE_*`` flags.

        Raises:
            ArgumentError: MPI.Exception ERR_FILE.
        """
        return self._state("Get_amode").amode

    amode = property(Get_amode, doc="The access mode.")

    # -- views (14.3) -------------------------------------------------------------------
    def Set_view(self, disp: int = 0, etype=None, filetype=None, datarep: str = "native",
                 info=None) -> None:
        """Set this rank's view; both file pointers go to 0 (collective, 14.3).

        Args:
            disp: byte displacement of the view, or ``DISPLACEMENT_CURRENT`` (files opened
                ``MODE_SEQUENTIAL``: the shared pointer's byte position).
            etype: the elementary datatype (default ``BYTE``), same size on every rank.
            filetype: the datatype tiled from ``disp`` (default: ``etype``).
            datarep: ``"native"`` or ``"internal"``, the same on every rank.
            info: hints, as :meth:`Set_info`.

        Returns:
            None.

        Raises:
            ArgumentError: MPI.Exception ERR_TYPE (see :class:`View`), ERR_ARG (disp),
                ERR_UNSUPPORTED_DATAREP, ERR_NOT_SAME, ERR_FILE.
            TypeError: etype or filetype is not a Datatype.
        """
        s, where = self._state("Set_view"), "File.Set_view"
        etype = PREDEFINED["BYTE"] if etype is None else etype
        filetype = etype if filetype is None else filetype
        datarep = "native" if datarep is None else str(datarep)
        disp = as_int(disp, "disp", where)
        if datarep not in NATIVE:
            known = "registered with Register_datarep" if datarep in DATAREPS else \
                "unknown" if datarep != "external32" else "not implemented"
            raise mpi_error(ArgumentError, "ERR_UNSUPPORTED_DATAREP", f"{where}: datarep="
                         f"{datarep!r} is {known}; pycomm writes \"native\" bytes only")
        if disp == DISPLACEMENT_CURRENT and not s.amode & MODE_SEQUENTIAL:
            raise mpi_error(ArgumentError, "ERR_ARG", f"{where}: DISPLACEMENT_CURRENT needs a "
                         "file opened MODE_SEQUENTIAL")
        view = View(0 if disp == DISPLACEMENT_CURRENT else disp, etype, filetype, datarep,
                    where)
        shared = s.shared
        seen = s.comm.allgather((datarep, view.esize))
        if len(set(seen)) > 1:
            raise mpi_error(ArgumentError, "ERR_NOT_SAME", f"{where}: the ranks passed "
                         f"different (datarep, etype size): {seen}")
        if disp == DISPLACEMENT_CURRENT:
            shared = self._shared(s, where)
            here = s.view.byte_offset(shared.get()) if s.comm.rank == 0 else None
            view.disp = s.comm.bcast(here, 0)
        if s.comm.rank == 0 and shared is not None:
            shared.set(0)
        s.comm.Barrier()                    # nobody uses the pointer before it is reset
        if isinstance(info, Info) and info:
            s.info.update(info.items())
        s.view, s.pos = view, 0

    def Get_view(self) -> tuple:
        """This rank's view (14.3).

        Returns:
            tuple: ``(disp, etype, filetype, datarep)``; derived types are new handles.

        Raises:
            ArgumentError: MPI.Exception ERR_FILE.
        """
        v = self._state("Get_view").view
        return v.disp, _handle(v.etype), _handle(v.filetype), v.datarep

    def free(self) -> None:
        """Close the file unless the handle is null (mpi4py's ``free()``).

        Returns:
            None.

        Raises:
            Nothing.
        """
        if self._s is not None and not self._s.closed:
            self.Close()
        self._s = None


def _handle(dt):
    return dt if dt.is_predefined else type(dt)(dt)


def _release(fd: int | None, shared) -> None:
    """Close a descriptor and a shared pointer, either of which may be None."""
    for close in (fd is not None and (lambda: os.close(fd)),
                  shared is not None and shared.close):
        try:
            close and close()
        except OSError:
            pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _file_null() -> File:
    return FILE_NULL


FILE_NULL = File()
