"""Attributes of an open ``MPI.File``: group, hints, atomicity, sync, error handlers;
``MPI.Register_datarep``.

The mixin :class:`FileAttributes` of :class:`pycomm.MPI.file.File` (MPI-4.1 14.2.7,
14.2.8, 14.5.2, 14.6.1, 14.7); it needs ``_state(call)``, which returns the open file's
state (``comm``, ``fd``, ``path``, ``info``, ``atomic``, ``errhandler``), and ``_s``,
None for ``FILE_NULL``. ``FILE_NULL`` has an error handler of its own, which files opened
afterwards start with (14.7).
"""

from __future__ import annotations

import os

from pycomm.errors import ArgumentError, CommError

from .exceptions import mpi_error, translate_methods
from .fileio import os_error
from .info import Info

__all__ = ["DATAREPS", "NATIVE", "NULL_STATE", "FileAttributes", "Register_datarep"]

NULL_STATE = {"errhandler": None}           # FILE_NULL's error handler: new files get it
DATAREPS: dict[str, tuple] = {}            # Register_datarep's names -> their functions
NATIVE = ("native", "internal")            # the representations Set_view accepts


@translate_methods
class FileAttributes:
    """Group, hints, atomicity, ``Sync`` and error handlers of a file (module docstring)."""

    def Get_group(self):
        """The group of the ranks that opened the file (14.2.7).

        Returns:
            Group: a new group.

        Raises:
            ArgumentError: MPI.Exception ERR_FILE.
        """
        return self._state("Get_group").comm.Get_group()

    group = property(Get_group, doc="The group of the ranks that opened the file.")
    group_size = property(lambda self: self._state("group_size").comm.size,
                          doc="Ranks that opened the file.")
    group_rank = property(lambda self: self._state("group_rank").comm.rank,
                          doc="This rank in the file's group.")

    def Set_info(self, info) -> None:
        """Add hints (14.2.8); pycomm keeps them for ``Get_info`` and follows none.

        Args:
            info: an ``Info`` or ``INFO_NULL``.

        Returns:
            None.

        Raises:
            ArgumentError: MPI.Exception ERR_FILE.
        """
        s = self._state("Set_info")
        if isinstance(info, Info) and info:
            s.info.update(info.items())

    def Get_info(self):
        """The hints in use (14.2.8).

        Returns:
            Info: a new info object.

        Raises:
            ArgumentError: MPI.Exception ERR_FILE.
        """
        return Info.Create(self._state("Get_info").info)

    info = property(Get_info, Set_info, doc="The hints in use.")

    def Get_type_extent(self, datatype) -> int:
        """The extent of ``datatype`` in the file (14.5.2): its own, for native data.

        Args:
            datatype: a Datatype.

        Returns:
            int: bytes.

        Raises:
            ArgumentError: MPI.Exception ERR_FILE, ERR_TYPE.
        """
        from .predefined import to_datatype
        self._state("Get_type_extent")
        return to_datatype(datatype, "File.Get_type_extent").extent

    # -- consistency (14.6) -------------------------------------------------------------
    def Set_atomicity(self, flag: bool) -> None:
        """Atomic mode on or off (collective, 14.6.1): accesses lock their byte span.

        Args:
            flag: True for atomic mode; the same on every rank.

        Returns:
            None.

        Raises:
            ArgumentError: MPI.Exception ERR_NOT_SAME, ERR_FILE.
        """
        s = self._state("Set_atomicity")
        flags = s.comm.allgather(bool(flag))
        if len(set(flags)) > 1:
            raise mpi_error(ArgumentError, "ERR_NOT_SAME", "File.Set_atomicity: the ranks "
                         f"passed different flags {flags}")
        s.atomic = bool(flag)

    def Get_atomicity(self) -> bool:
        """Whether the file is in atomic mode (14.6.1).

        Returns:
            bool: the mode.

        Raises:
            ArgumentError: MPI.Exception ERR_FILE.
        """
        return self._state("Get_atomicity").atomic

    atomicity = property(Get_atomicity, Set_atomicity, doc="Atomic mode.")

    def Sync(self) -> None:
        """Flush this rank's writes to the storage device (``fdatasync``, 14.6.1).

        Returns:
            None.

        Raises:
            ArgumentError: MPI.Exception ERR_FILE.
            CommError: MPI.Exception ERR_IO from the system.
        """
        s = self._state("Sync")
        try:
            os.fdatasync(s.fd)
        except OSError as exc:
            raise os_error(exc, "File.Sync", s.path) from None

    # -- error handlers (14.7; File.Create_errhandler: pycomm.MPI.errhandlers) ----------
    def _eh_state(self):
        return NULL_STATE if self._s is None else self._state("errhandler")

    def _eh(self):
        st = self._eh_state()
        return st["errhandler"] if st is NULL_STATE else st.errhandler

    def _current_errhandler(self):
        """The handler set (its shared part), or None: read by failing calls."""
        try:
            eh = self._eh()
        except CommError:
            return None
        return eh._handle if eh is not None else None

    def Get_errhandler(self):
        """A new handle to the file's error handler (a new file gets ``FILE_NULL``'s).

        Returns:
            Errhandler: ``ERRORS_RETURN`` unless another was set.

        Raises:
            ArgumentError: MPI.Exception ERR_FILE (a closed file).
        """
        from . import Errhandler, default_errhandler
        return Errhandler(self._eh() or default_errhandler())

    def Set_errhandler(self, errhandler) -> None:
        """Set the file's error handler (``FILE_NULL``'s: the one new files get). A
        user-defined one (``File.Create_errhandler``) gets the errors of this file's
        calls instead of an exception (:mod:`pycomm.MPI.errhandlers`).

        Args:
            errhandler: an Errhandler.

        Returns:
            None.

        Raises:
            TypeError: not an Errhandler.
            ArgumentError: MPI.Exception ERR_FILE (a closed file), ERR_ERRHANDLER
                (ERRHANDLER_NULL), ERR_ARG (another kind's user-defined handler).
        """
        from .errhandlers import checked
        st = self._eh_state()
        eh = checked("File", errhandler, "File.Set_errhandler")
        if st is NULL_STATE:
            st["errhandler"] = eh
        else:
            st.errhandler = eh

    def Call_errhandler(self, errorcode: int) -> None:
        """Run the file's error handler on ``errorcode`` (a user-defined one is called,
        ``ERRORS_RETURN`` does nothing, ``ERRORS_ARE_FATAL``/``ERRORS_ABORT`` end the job).

        Args:
            errorcode: an MPI error code.

        Returns:
            None.

        Raises:
            ArgumentError: MPI.Exception ERR_FILE (a closed file).
        """
        from . import default_errhandler
        from .errhandlers import call_errhandler
        call_errhandler(self, self._eh() or default_errhandler(), int(errorcode))


def Register_datarep(datarep: str, read_fn, write_fn, extent_fn) -> None:
    """Record a user data representation (14.5.3); ``Set_view`` refuses it, since pycomm
    converts no data, with ``ERR_UNSUPPORTED_DATAREP``.

    Args:
        datarep: its name (at most ``MAX_DATAREP_STRING`` characters).
        read_fn, write_fn: the conversion functions (or None).
        extent_fn: the extent function.

    Returns:
        None.

    Raises:
        ArgumentError: MPI.Exception ERR_DUP_DATAREP (a predefined or registered name),
            ERR_ARG (an empty or too long name).
    """
    name = str(datarep)
    if not name or len(name) > 128:
        raise mpi_error(ArgumentError, "ERR_ARG", f"Register_datarep: datarep={name!r} must "
                     "have 1 to MAX_DATAREP_STRING (128) characters")
    if name in DATAREPS or name in (*NATIVE, "external32"):
        raise mpi_error(ArgumentError, "ERR_DUP_DATAREP", f"Register_datarep: {name!r} is "
                     "already defined")
    DATAREPS[name] = (read_fn, write_fn, extent_fn)
