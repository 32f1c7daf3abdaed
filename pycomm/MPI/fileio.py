"""POSIX side of MPI-IO: open flags, errors, moving segments, locks, the shared pointer.

Everything here is one rank's system calls; :mod:`pycomm.MPI.file` does the collective
agreement around them.

* :func:`os_error` maps an ``OSError`` to the MPI error class (MPI-4.1 14.7, table
  14.3): ``ENOENT`` -> ``ERR_NO_SUCH_FILE``, ``EEXIST`` -> ``ERR_FILE_EXISTS``,
  ``EACCES``/``EPERM`` -> ``ERR_ACCESS``, ``EROFS`` -> ``ERR_READ_ONLY``, ``ENOSPC`` ->
  ``ERR_NO_SPACE``, ``EDQUOT`` -> ``ERR_QUOTA``, a bad name -> ``ERR_BAD_FILE``, the rest
  ``ERR_IO``, the message naming the call, the file and the system's words.
* :func:`read_segments` / :func:`write_segments` move the bytes of a view's segments
  (:meth:`pycomm.MPI.fileview.View.segments`) with ``pread``/``pwrite``. Many small
  segments close together (under 4 KiB on average, their span at most 4x their data or
  64 KiB) move as their whole span (ROMIO's "data sieving"): a read reads the span once
  and gathers, a write reads the span, scatters its bytes in and writes the span back.
  Equal segments at a constant stride (a vector filetype) are one strided numpy view,
  others one index. A read stops at the end of file: the bytes before it count.
* Locks (POSIX record locks, ``fcntl``, over an access's span): in atomic mode
  (``File.Set_atomicity(True)``, 14.6.1) reads take a shared one and writes an exclusive
  one, so overlapping accesses of different ranks are serialized; in any mode a write to
  a file of several ranks takes an exclusive one when the file system grants it, so
  that a sieved write never puts back stale bytes of a hole another rank is writing
  (without a lock, writes go segment by segment).
  Measured (2 ranks, 64 MiB each, page cache, 2-core VM): contiguous 156 MiB/s write,
  235 read; 8 KiB blocks interleaved 541 / 2153; 8-byte items interleaved 29 / 97 (one
  ``pwrite``/``pread`` per segment: 0.5 / 5.7).
* The shared file pointer (14.4.4) is an 8-byte counter in a small file every rank of
  the file opened (:class:`FilePointer`); each shared access locks it, reads it and
  advances it: a rank takes its place without waiting for any other to enter pycomm (a
  protocol through the communicator would need the pointer's owner to answer while it
  computes). A file opened by one rank keeps its pointer in memory (:class:`LocalPointer`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct

import numpy as np

from pycomm.errors import CommError

from .exceptions import mpi_error

__all__ = ["FilePointer", "LocalPointer", "locked", "os_error", "read_segments",
           "write_segments"]

_CLASS_OF_ERRNO = {
    errno.ENOENT: "ERR_NO_SUCH_FILE", errno.EEXIST: "ERR_FILE_EXISTS",
    errno.EACCES: "ERR_ACCESS", errno.EPERM: "ERR_ACCESS", errno.EROFS: "ERR_READ_ONLY",
    errno.ENOSPC: "ERR_NO_SPACE", errno.EDQUOT: "ERR_QUOTA", errno.EISDIR: "ERR_BAD_FILE",
    errno.ENOTDIR: "ERR_BAD_FILE", errno.ENAMETOOLONG: "ERR_BAD_FILE",
    errno.EBADF: "ERR_ACCESS", errno.ETXTBSY: "ERR_FILE_IN_USE",
}
_SIEVE_MIN = 1 << 16        # a read span this small is read whole whatever the holes
_SIEVE_RATIO = 4            # ... or a span at most this many times the data it holds
_BIG_SEGMENT = 4096         # segments this long on average move one by one


def os_error(exc: OSError, where: str, path: str | None = None):
    """``exc`` as an ``MPI.Exception`` of the class its errno maps to.

    Args:
        exc: the error the system call raised.
        where: the call (``"File.Open"``...).
        path: the file's name, for the message.

    Returns:
        MPI.Exception: also a :class:`pycomm.errors.CommError`.

    Raises:
        Nothing.
    """
    code = _CLASS_OF_ERRNO.get(exc.errno, "ERR_IO")
    name = f" {path!r}" if path is not None else ""
    return mpi_error(CommError, code, f"{where}{name}: {exc.strerror or exc}")


def _pread_into(fd: int, out: memoryview, offset: int) -> int:
    """Fill ``out`` from file byte ``offset``; return the bytes read (fewer at EOF)."""
    done = 0
    while done < len(out):
        n = os.preadv(fd, [out[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


def _span_view(whole: np.ndarray, offs: np.ndarray, lens: np.ndarray, first: int):
    """The segments' bytes inside ``whole`` (the span read from ``first``) as one array
    view when they are equal runs at a constant stride (a vector filetype), else None."""
    rel = offs - first
    if lens.size < 2 or (lens != lens[0]).any() or \
            (np.diff(rel) != rel[1] - rel[0]).any():
        return None
    k, ln, step = lens.size, int(lens[0]), int(rel[1] - rel[0])
    return np.lib.stride_tricks.as_strided(whole[int(rel[0]):], shape=(k, ln),
                                           strides=(step, 1), writeable=True)


def _valid(offs: np.ndarray, lens: np.ndarray, end: int) -> int:
    """Data bytes of the segments (increasing offsets) that lie before file byte ``end``."""
    return int(np.clip(end - offs, 0, lens).sum())


def _sieve(offs: np.ndarray, lens: np.ndarray, total: int) -> bool:
    """Whether to move the segments' whole span at once: many small segments, few holes."""
    span = int(offs[-1] + lens[-1] - offs[0])
    return offs.size > 1 and total < _BIG_SEGMENT * offs.size and \
        span <= max(_SIEVE_MIN, _SIEVE_RATIO * total)


def _gather(whole: np.ndarray, offs: np.ndarray, lens: np.ndarray, first: int,
            out: np.ndarray, scatter: bool) -> None:
    """Copy the segments' bytes of ``whole`` into ``out`` (or back, ``scatter``)."""
    view = _span_view(whole, offs, lens, first)
    if view is not None:
        if scatter:
            view[...] = out.reshape(view.shape)
        else:
            out.reshape(view.shape)[...] = view
        return
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    index = np.arange(out.size, dtype=np.int64) + np.repeat(offs - first - starts, lens)
    if scatter:
        whole[index] = out
    else:
        out[...] = whole[index]


def read_segments(fd: int, offs: np.ndarray, lens: np.ndarray, out: np.ndarray) -> int:
    """Read the segments, in order, into the first bytes of ``out`` (uint8).

    Args:
        fd: an open file descriptor (readable).
        offs, lens: the segments' file offsets (increasing) and lengths.
        out: a writable uint8 array of at least ``lens.sum()`` bytes.

    Returns:
        int: bytes read, counted in data order up to the end of the file.

    Raises:
        OSError: the system refused a read.
    """
    total = int(lens.sum()) if lens.size else 0
    if total == 0:
        return 0
    mv = memoryview(out)
    if offs.size == 1:
        return _pread_into(fd, mv[:total], int(offs[0]))
    if _sieve(offs, lens, total):
        first, span = int(offs[0]), int(offs[-1] + lens[-1] - offs[0])
        whole = np.zeros(span, np.uint8)            # past EOF: zeros, counted out below
        got = _pread_into(fd, memoryview(whole), first)
        _gather(whole, offs, lens, first, out[:total], False)
        return _valid(offs, lens, first + got)
    done = 0
    for off, ln in zip(offs.tolist(), lens.tolist()):
        n = _pread_into(fd, mv[done:done + ln], off)
        done += n
        if n < ln:
            break
    return done


def write_segments(fd: int, offs: np.ndarray, lens: np.ndarray, data: np.ndarray,
                   sieve: bool = False) -> int:
    """Write the bytes of ``data`` (uint8) to the segments, in order.

    Args:
        fd: an open file descriptor (writable).
        offs, lens: the segments' file offsets and lengths (``lens.sum() == data.size``).
        data: the bytes to write.
        sieve: the caller holds an exclusive lock over the span and the descriptor can
            read: many small segments may then be written as one read-modify-write of
            their span.

    Returns:
        int: bytes written (all of them).

    Raises:
        OSError: the system refused a write (no space, quota...).
    """
    nbytes = int(data.size)
    if sieve and _sieve(offs, lens, nbytes):
        first, span = int(offs[0]), int(offs[-1] + lens[-1] - offs[0])
        whole = np.zeros(span, np.uint8)
        _pread_into(fd, memoryview(whole), first)   # the holes keep their bytes
        _gather(whole, offs, lens, first, data, True)
        offs, lens, data = np.array([first]), np.array([span]), whole
    mv, done = memoryview(data), 0
    for off, ln in zip(offs.tolist(), lens.tolist()):
        end = done + ln
        while done < end:
            done += os.pwrite(fd, mv[done:end], off + ln - (end - done))
    return nbytes


@contextlib.contextmanager
def locked(fd: int, offs: np.ndarray, lens: np.ndarray, exclusive: bool, on: bool = True,
           required: bool = True):
    """Hold a POSIX record lock over the span of the segments (atomic mode, 14.6.1, and
    the read-modify-write of a sieved write).

    Args:
        fd: the file's descriptor.
        offs, lens: the segments (the lock covers first offset .. last end).
        exclusive: a write lock (else a read lock).
        on: False to lock nothing.
        required: False when the file system may refuse locks (the caller then does
            without what needs one).

    Returns:
        A context manager giving True when the lock is held.

    Raises:
        OSError: the lock could not be taken and ``required``.
    """
    if not on or offs.size == 0:
        yield False
        return
    start, length = int(offs[0]), int(offs[-1] + lens[-1] - offs[0])
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, length, start)
    except OSError:
        if required:
            raise
        yield False
        return
    try:
        yield True
    finally:
        fcntl.lockf(fd, fcntl.LOCK_UN, length, start)


class LocalPointer:
    """The shared file pointer of a file only one rank opened: a number in memory."""

    def __init__(self, value: int = 0):
        self.value = int(value)

    def fetch_add(self, n: int) -> int:
        """Advance the pointer by ``n`` etypes; return its value before.

        Args:
            n: etypes to advance.

        Returns:
            int: the old value.

        Raises:
            Nothing.
        """
        old, self.value = self.value, self.value + int(n)
        return old

    def get(self) -> int:
        """The pointer's value (etypes).

        Returns:
            int: the value.

        Raises:
            Nothing.
        """
        return self.value

    def set(self, value: int) -> None:
        """Set the pointer.

        Args:
            value: the new value (etypes).

        Returns:
            None.

        Raises:
            Nothing.
        """
        self.value = int(value)

    def close(self) -> None:
        """Nothing to release.

        Returns:
            None.

        Raises:
            Nothing.
        """


class FilePointer(LocalPointer):
    """The shared file pointer of a file opened by several ranks: a little-endian int64
    at byte 0 of a file each rank holds open (made by one rank, unlinked once every rank
    opened it), read and advanced under an exclusive ``fcntl`` lock."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_RDWR)

    @staticmethod
    def create(path: str) -> None:
        """Make the pointer's file, holding 0.

        Args:
            path: where (a new name).

        Returns:
            None.

        Raises:
            OSError: it cannot be made there.
        """
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.pwrite(fd, struct.pack("<q", 0), 0)
        finally:
            os.close(fd)

    def _update(self, fn, exclusive: bool = True) -> int:
        fcntl.lockf(self.fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, 8, 0)
        try:
            (old,) = struct.unpack("<q", os.pread(self.fd, 8, 0))
            new = fn(old)
            if new is not None:
                os.pwrite(self.fd, struct.pack("<q", new), 0)
            return old
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 8, 0)

    def fetch_add(self, n: int) -> int:
        return self._update(lambda old: old + int(n))

    def get(self) -> int:
        return self._update(lambda old: None, exclusive=False)

    def set(self, value: int) -> None:
        self._update(lambda old: int(value))

    def close(self) -> None:
        os.close(self.fd)

    fetch_add.__doc__, get.__doc__, set.__doc__, close.__doc__ = \
        LocalPointer.fetch_add.__doc__, LocalPointer.get.__doc__, \
        LocalPointer.set.__doc__, "Close the pointer's file.\n\nReturns:\n    None.\n"
