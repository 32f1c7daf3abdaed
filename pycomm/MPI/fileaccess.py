"""Data access of ``MPI.File`` (MPI-4.1 14.4): reads and writes, file pointers.

Every access is one core, :meth:`DataAccess._move`: parse the message spec (the memory
side, :func:`pycomm.MPI.msgspec.message`: ``buf``, ``[buf, count, datatype]``...; a
derived datatype is packed or unpacked around the transfer), check it is a whole number
of etypes, find where it starts in the view, turn that into file segments
(:meth:`pycomm.MPI.fileview.View.segments`) and move them (:mod:`pycomm.MPI.fileio`).
Everything that can be refused is refused before a byte moves. The status of an access
counts the bytes that moved, so ``Get_count(datatype)``/``Get_elements(datatype)`` give
items of the type asked for; a read that meets the end of file moves what is before it.

Positioning (14.4.1, table 14.1), one table of names below makes every method:

=============  ====================================  =========================
where          calls                                 offset
=============  ====================================  =========================
explicit       ``Read_at``, ``Write_at_all``...      the ``offset`` argument
individual     ``Read``, ``Write_all``...            this rank's file pointer,
                                                     advanced by what moved
shared         ``Read_shared``, ``Write_shared``     the shared pointer, taken
                                                     and advanced under its lock
ordered        ``Read_ordered``, ``Write_ordered``   the shared pointer; ranks in
                                                     rank order (collective)
=============  ====================================  =========================

Collective calls (``*_all``) need no agreement among the ranks here: each rank moves its
own segments, which MPI allows (a collective access "may" synchronize, 14.4.1); the
ordered ones gather the counts, and one rank advances the shared pointer by their sum.
Nonblocking calls (``Iread``...) and split collectives (``*_begin``/``*_end``, 14.4.5)
do their work when they are called: the request is complete when returned, ``*_end``
gives the status of its ``*_begin`` (MPI lets an implementation finish an operation in
the starting call). Only one split collective may be in progress per file
(``ERR_IO`` otherwise, as in ROMIO).
"""

from __future__ import annotations

import numpy as np

from pycomm.errors import ArgumentError, CommError

from .exceptions import mpi_error, translate_methods
from .fileio import locked, os_error, read_segments, write_segments
from .msgspec import _raw, as_int, message

__all__ = ["DataAccess"]

SEEK_SET, SEEK_CUR, SEEK_END = 600, 602, 604
_MODE_RDONLY, _MODE_WRONLY, _MODE_SEQUENTIAL = 2, 4, 256
_SECTION = {"at": "14.4.2", "ind": "14.4.3", "shared": "14.4.4", "ordered": "14.4.4"}
_USING = {"at": "explicit offset", "ind": "individual file pointer",
          "shared": "shared file pointer", "ordered": "shared file pointer"}


def _error(code: str, message: str, cls: type = ArgumentError):
    return mpi_error(cls, code, message)


def _done_request(nbytes: int):
    """A request that is complete already, its status counting ``nbytes`` bytes."""
    import pycomm
    from pycomm.p2p import ANY_SOURCE, ANY_TAG
    from pycomm.request import Request as Inner

    from .request import Request
    inner = Inner(pycomm.init()._engine, None, -1, ANY_SOURCE, ANY_TAG)
    inner.source, inner.count = ANY_SOURCE, int(nbytes)
    inner._complete()
    return Request._wrap(inner)


def _fill(status, nbytes: int) -> None:
    if status is not None:
        status.count, status.error, status.cancelled = int(nbytes), 0, False


def _address(spec) -> int | None:
    """The first byte's address of a message's buffer (None when it has none)."""
    buf = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
    try:
        raw, _ = _raw(buf, False, "", "")
        return raw.ctypes.data
    except (TypeError, ValueError, BufferError, CommError):
        return None


class DataAccess:
    """The data access calls of :class:`pycomm.MPI.file.File` (see the module docstring);
    the class needs ``_state(call)``, which returns the open file's state."""

    # -- the core -----------------------------------------------------------------------
    def _shared(self, s, where: str):
        if s.shared is None:
            raise _error("ERR_UNSUPPORTED_OPERATION", f"{where}: this file has no shared "
                         "file pointer: its file could be made neither in /dev/shm (ranks "
                         "on one host) nor next to the file")
        return s.shared

    def _check_access(self, s, where: str, write: bool, how: str) -> None:
        if write and s.amode & _MODE_RDONLY:
            raise _error("ERR_READ_ONLY", f"{where}: the file was opened MODE_RDONLY")
        if not write and s.amode & _MODE_WRONLY:
            raise _error("ERR_ACCESS", f"{where}: the file was opened MODE_WRONLY")
        if s.amode & _MODE_SEQUENTIAL and how in ("at", "ind"):
            raise _error("ERR_UNSUPPORTED_OPERATION", f"{where}: the file was opened "
                         "MODE_SEQUENTIAL: only shared file pointer calls may access it")

    def _move(self, call: str, write: bool, how: str, buf, offset=None) -> int:
        """Do one access (the module docstring); return the bytes moved."""
        s, where = self._state(call), f"File.{call}"
        self._check_access(s, where, write, how)
        if how == "at":
            offset = as_int(offset, "offset", where)
            if offset < 0:
                raise _error("ERR_ARG", f"{where}: offset={offset} is negative")
        msg = message(buf, where, "buf", writable=not write)
        data = msg.array.reshape(-1).view(np.uint8)
        view = s.view
        if data.size % view.esize:
            raise _error("ERR_TYPE", f"{where}: buf holds {data.size} bytes, not a whole "
                         f"number of etypes of {view.esize} bytes")
        n = data.size // view.esize
        if how == "ind":
            offset = s.pos
        elif how == "shared":
            offset = self._shared(s, where).fetch_add(n)
        elif how == "ordered":
            offset = self._ordered_offset(s, where, n)
        offs, lens = view.segments(offset * view.esize, data.size)
        try:
            # a write of a file of several ranks locks its span when it can: sieved
            # writes (read-modify-write of a span) are then safe against the others'
            with locked(s.fd, offs, lens, write, s.atomic or (write and s.comm.size > 1),
                        required=s.atomic) as held:
                if write:
                    done = write_segments(s.fd, offs, lens, data, sieve=not s.amode &
                                          _MODE_WRONLY and (held or s.comm.size == 1))
                else:
                    done = read_segments(s.fd, offs, lens, data)
        except OSError as exc:
            raise os_error(exc, where, s.path) from None
        if not write:
            msg.finish()
        if how == "ind":
            s.pos = offset + done // view.esize
        return done

    def _ordered_offset(self, s, where: str, n: int) -> int:
        """This rank's offset of an ordered access: the shared pointer plus the etypes of
        the ranks below; one rank advances the pointer by everyone's (collective)."""
        shared = self._shared(s, where)
        if s.comm.size == 1:
            return shared.fetch_add(n)
        counts = s.comm.allgather(n)
        base = shared.fetch_add(sum(counts)) if s.comm.rank == 0 else None
        return s.comm.bcast(base, 0) + sum(counts[:s.comm.rank])

    def _begin(self, call: str, write: bool, how: str, buf, offset=None) -> None:
        s = self._state(call)
        if s.split is not None:
            raise _error("ERR_IO", f"File.{call}: {s.split[0]} is still in progress on "
                         "this file (one split collective at a time, MPI-4.1 14.4.5)")
        done = self._move(call, write, how, buf, offset)
        s.split = (call, done, _address(buf))

    def _end(self, call: str, buf, status) -> None:
        s, begin = self._state(call), call[:-len("_end")] + "_begin"
        if s.split is None or s.split[0] != begin:
            now = f"{s.split[0]} is" if s.split else "none is"
            raise _error("ERR_IO", f"File.{call}: no {begin} in progress ({now})")
        addr = _address(buf)
        if None not in (addr, s.split[2]) and addr != s.split[2]:
            raise _error("ERR_BUFFER", f"File.{call}: buf is not the buffer {begin} was "
                         "given (MPI-4.1 14.4.5)")
        _fill(status, s.split[1])
        s.split = None

    # -- pointers (14.4.3, 14.4.4) ------------------------------------------------------
    def _target(self, s, where: str, offset, whence, current: int) -> int:
        offset = as_int(offset, "offset", where)
        if whence == SEEK_SET:
            new = offset
        elif whence == SEEK_CUR:
            new = current + offset
        elif whence == SEEK_END:
            import os
            data = s.view.data_before(os.fstat(s.fd).st_size)
            new = -(-data // s.view.esize) + offset
        else:
            raise _error("ERR_ARG", f"{where}: whence={whence!r} is not SEEK_SET, SEEK_CUR "
                         "or SEEK_END")
        if new < 0:
            raise _error("ERR_ARG", f"{where}: offset {offset} from whence {whence} gives "
                         f"position {new}, before the start of the view")
        return new

    def Seek(self, offset: int, whence: int = SEEK_SET) -> None:
        """Move the individual file pointer (14.4.3).

        Args:
            offset: etypes, from ``whence``.
            whence: ``SEEK_SET`` (the view's start), ``SEEK_CUR`` or ``SEEK_END`` (the
                first etype of the view at or past the end of file).

        Returns:
            None.

        Raises:
            ArgumentError: MPI.Exception ERR_ARG (a bad whence, a negative position),
                ERR_UNSUPPORTED_OPERATION (MODE_SEQUENTIAL), ERR_FILE.
        """
        s, where = self._state("Seek"), "File.Seek"
        if s.amode & _MODE_SEQUENTIAL:
            raise _error("ERR_UNSUPPORTED_OPERATION", f"{where}: the file was opened "
                         "MODE_SEQUENTIAL: it has no individual file pointer")
        s.pos = self._target(s, where, offset, whence, s.pos)

    def Get_position(self) -> int:
        """The individual file pointer, in etypes of the view (14.4.3).

        Returns:
            int: etypes.

        Raises:
            ArgumentError: MPI.Exception ERR_FILE.
        """
        return self._state("Get_position").pos

    def Get_byte_offset(self, offset: int) -> int:
        """The absolute file byte of view offset ``offset`` (14.4.3).

        Args:
            offset: etypes of the view, >= 0.

        Returns:
            int: bytes from the start of the file.

        Raises:
            ArgumentError: MPI.Exception ERR_ARG (negative), ERR_FILE.
        """
        s, where = self._state("Get_byte_offset"), "File.Get_byte_offset"
        offset = as_int(offset, "offset", where)
        if offset < 0:
            raise _error("ERR_ARG", f"{where}: offset={offset} is negative")
        return s.view.byte_offset(offset)

    def Seek_shared(self, offset: int, whence: int = SEEK_SET) -> None:
        """Move the shared file pointer (collective, 14.4.4): every rank passes the same
        arguments; one rank moves it once every rank arrived.

        Args:
            offset: etypes, from ``whence``.
            whence: ``SEEK_SET``, ``SEEK_CUR`` or ``SEEK_END``.

        Returns:
            None.

        Raises:
            ArgumentError: MPI.Exception ERR_ARG, ERR_NOT_SAME, ERR_FILE,
                ERR_UNSUPPORTED_OPERATION (no shared pointer).
        """
        s, where = self._state("Seek_shared"), "File.Seek_shared"
        shared = self._shared(s, where)
        offset = as_int(offset, "offset", where)
        if whence not in (SEEK_SET, SEEK_CUR, SEEK_END):
            raise _error("ERR_ARG", f"{where}: whence={whence!r} is not SEEK_SET, SEEK_CUR "
                         "or SEEK_END")
        seen = s.comm.allgather((offset, whence))
        if len(set(seen)) > 1:
            raise _error("ERR_NOT_SAME", f"{where}: the ranks passed different (offset, "
                         f"whence): {seen}")
        fail = None
        if s.comm.rank == 0:
            try:
                shared.set(self._target(s, where, offset, whence, shared.get()))
            except ArgumentError as exc:
                fail = str(exc)
        fail = s.comm.bcast(fail, 0)
        if fail is not None:
            raise _error("ERR_ARG", fail)

    def Get_position_shared(self) -> int:
        """The shared file pointer, in etypes of the view (14.4.4).

        Returns:
            int: etypes.

        Raises:
            ArgumentError: MPI.Exception ERR_FILE, ERR_UNSUPPORTED_OPERATION.
        """
        s = self._state("Get_position_shared")
        return self._shared(s, "File.Get_position_shared").get()


# -- the methods, from one table ------------------------------------------------------
_ARGS_DOC = """
Args:
{offset}    buf: the memory: ``buf``, ``[buf, datatype]``, ``[buf, count, datatype]``...
        (a whole number of etypes).{status}
"""
_RAISES_DOC = """
Raises:
    ArgumentError: MPI.Exception ERR_FILE, ERR_TYPE, ERR_ARG, ERR_BUFFER, ERR_ACCESS,
        ERR_READ_ONLY, ERR_UNSUPPORTED_OPERATION{extra} (see :mod:`pycomm.MPI.file`).
    CommError: MPI.Exception ERR_IO, ERR_NO_SPACE... from the system.
"""


def _doc(summary: str, how: str, offset: bool, status: bool, returns: str,
         extra: str = "") -> str:
    off = "    offset: where, in etypes of the view.\n" if offset else ""
    st = "\n    status: a Status to fill (its count: the bytes moved), or None." \
        if status else ""
    return (f"{summary} (MPI-4.1 {_SECTION[how]}).\n" + _ARGS_DOC.format(
        offset=off, status=st) + f"\nReturns:\n    {returns}\n"
        + _RAISES_DOC.format(extra=extra))


def _blocking(name: str, write: bool, how: str):
    if how == "at":
        def method(self, offset: int, buf, status=None) -> None:
            _fill(status, self._move(name, write, how, buf, offset))
    else:
        def method(self, buf, status=None) -> None:
            _fill(status, self._move(name, write, how, buf))
    return method


def _nonblocking(name: str, write: bool, how: str):
    if how == "at":
        def method(self, offset: int, buf):
            return _done_request(self._move(name, write, how, buf, offset))
    else:
        def method(self, buf):
            return _done_request(self._move(name, write, how, buf))
    return method


def _beginning(name: str, write: bool, how: str):
    if how == "at":
        def method(self, offset: int, buf) -> None:
            self._begin(name, write, how, buf, offset)
    else:
        def method(self, buf) -> None:
            self._begin(name, write, how, buf)
    return method


def _ending(name: str):
    def method(self, buf, status=None) -> None:
        self._end(name, buf, status)
    return method


def _install() -> None:
    """Add Read/Write x positioning x form to :class:`DataAccess` (mpi4py's names)."""
    for verb, write in (("Read", False), ("Write", True)):
        word = verb.lower()
        for how, suffix in (("at", "_at"), ("ind", ""), ("shared", "_shared"),
                            ("ordered", "_ordered")):
            using = _USING[how]
            forms = []
            if how in ("at", "ind"):
                forms = [(f"{verb}{suffix}", "", _blocking),
                         (f"{verb}{suffix}_all", "Collective ", _blocking),
                         (f"I{word}{suffix}", "Nonblocking ", _nonblocking),
                         (f"I{word}{suffix}_all", "Nonblocking collective ", _nonblocking)]
                split = f"{verb}{suffix}_all"
            elif how == "shared":
                forms = [(f"{verb}{suffix}", "", _blocking),
                         (f"I{word}{suffix}", "Nonblocking ", _nonblocking)]
                split = None
            else:
                forms = [(f"{verb}{suffix}", "Collective ", _blocking)]
                split = f"{verb}{suffix}"
            for name, kind, make in forms:
                fn = make(name, write, how)
                nb = make is _nonblocking
                what = f"{kind}{word}" if kind else verb
                fn.__doc__ = _doc(f"{what[0].upper()}{what[1:]} using {using}", how,
                                  how == "at", not nb, "Request: complete already." if nb
                                  else "None.", ", ERR_NOT_SAME" if how == "ordered" else "")
                fn.__name__ = fn.__qualname__ = name
                setattr(DataAccess, name, fn)
            if split is not None:
                begin, end = _beginning(split + "_begin", write, how), \
                    _ending(split + "_end")
                begin.__doc__ = _doc(f"Start a split collective {word} using {using}",
                                     how, how == "at", False, "None.", ", ERR_IO (one "
                                     "in progress)")
                end.__doc__ = _doc(f"Complete a split collective {word} using {using}",
                                   "ordered" if how == "ordered" else how, False, True,
                                   "None.", ", ERR_IO (none begun)")
                for fn, name in ((begin, split + "_begin"), (end, split + "_end")):
                    fn.__name__ = fn.__qualname__ = name
                    setattr(DataAccess, name, fn)


_install()
translate_methods(DataAccess)       # the generated methods, too
