"""POSIX side of MPI-IO: open flags, errors, moving segments, locks, the shared pointer.

Everything here is one rank's system calls; :mod:`pycomm.MPI.file` does the collective
agreement around them.

* :func:`os_error` maps an ``OSError`` to the MPI error class (MPI-4.1 14.7, table
  14.3): ``ENOENT`` -> ``ERR_NO_SUCH_FILE``, ``EEXIST`` -> ``ERR_FILE_EXISTS``,
  ``EACCES``/``EPERM`` -> ``ERR_ACCESS``, ``EROFS`` -> ``ERR_READ_ONLY``, ``ENOSPC`` ->
  ``ERR_NO_SPACE``, ``EDQUOT`` -> ``ERR_QUOTA``, a bad name -> ``ERR_BAD_FILE``, the rest
  ``ERR_IO``, the message naming the call, the file and the system's words.
* :func:`read_segments` / :func:`write_segments` move the bytes of a view's segments
  (:meth:`pycomm.MPI.fileview.View.segments`) with ``pread``/``pwrite``. Reads of many
  small segments close together read their whole span once and gather (ROMIO's "data
  sieving"); writes never do, since writing a span would overwrite the holes other ranks
  fill at the same time. A read stops at the end of file: the bytes before it count.
* In atomic mode (``File.Set_atomicity(True)``, 14.6.1) an access holds a POSIX record
  lock (``fcntl``) over its span: shared for reads, exclusive for writes, so that
  overlapping accesses of different ranks are serialized.
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
    first, span = int(offs[0]), int(offs[-1] + lens[-1] - offs[0])
    if span <= max(_SIEVE_MIN, _SIEVE_RATIO * total):
        whole = np.empty(span, np.uint8)
        got = _pread_into(fd, memoryview(whole), first)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        index = np.arange(total, dtype=np.int64) + np.repeat(offs - first - starts, lens)
        n = int(np.searchsorted(index, got))        # data bytes that lie before EOF
        out[:n] = whole[index[:n]]
        return n
    done = 0
    for off, ln in zip(offs.tolist(), lens.tolist()):
        n = _pread_into(fd, mv[done:done + ln], off)
        done += n
        if n < ln:
            break
    return done


def write_segments(fd: int, offs: np.ndarray, lens: np.ndarray, data: np.ndarray) -> int:
    """Write the bytes of ``data`` (uint8) to the segments, in order.

    Args:
        fd: an open file descriptor (writable).
        offs, lens: the segments' file offsets and lengths (``lens.sum() == data.size``).
        data: the bytes to write.

    Returns:
        int: bytes written (all of them).

    Raises:
        OSError: the system refused a write (no space, quota...).
    """
    mv, done = memoryview(data), 0
    for off, ln in zip(offs.tolist(), lens.tolist()):
        end = done + ln
        while done < end:
            done += os.pwrite(fd, mv[done:end], off + ln - (end - done))
    return done


@contextlib.contextmanager
def locked(fd: int, offs: np.ndarray, lens: np.ndarray, exclusive: bool, on: bool = True):
    """Hold a POSIX record lock over the span of the segments (atomic mode, 14.6.1).

    Args:
        fd: the file's descriptor.
        offs, lens: the segments (the lock covers first offset .. last end).
        exclusive: a write lock (else a read lock).
        on: False to lock nothing (non-atomic mode).

    Returns:
        A context manager.

    Raises:
        OSError: the lock could not be taken.
    """
    if not on or offs.size == 0:
        yield
        return
    start, length = int(offs[0]), int(offs[-1] + lens[-1] - offs[0])
    fcntl.lockf(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, length, start)
    try:
        yield
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
