"""The exception hierarchy: every error pycomm raises derives from :class:`CommError`."""

from __future__ import annotations

__all__ = [
    "CommError", "ArgumentError", "InvalidBufferError", "TruncationError", "PeerError",
    "CommTimeoutError", "RemoteError", "ProtocolError", "CollectiveError",
    "CollectiveMismatchError", "ThreadLevelError", "add_note",
]


class CommError(Exception):
    """Base class of every pycomm error."""


class ArgumentError(CommError, ValueError):
    """A call got a bad argument (rank, root, tag, count, dtype, op, algorithm...).

    Raised before any byte moves; the message names the argument, its value and the rank.
    """


class InvalidBufferError(ArgumentError):
    """A buffer is unusable: not contiguous, read-only where it is written, wrong size."""


class TruncationError(CommError):
    """An incoming message is larger than the posted receive buffer (MPI_ERR_TRUNCATE)."""


class PeerError(CommError, ConnectionError):
    """A peer rank died or its connection dropped; ``peer`` is its rank in COMM_WORLD."""

    def __init__(self, message: str, peer: int | None = None):
        super().__init__(message)
        self.peer = peer


class CommTimeoutError(CommError, TimeoutError):
    """A blocking operation did not complete within its timeout (``PYCOMM_TIMEOUT``)."""


class CollectiveError(CommError):
    """A collective call failed on another rank of the communicator, so it fails here too.

    Raised on every rank of a call that one rank abandoned (a bad argument it found before
    sending, a mismatch, a timeout, a dead peer): the message names that rank, the call
    (collective, sequence number, communicator) and its error. The communicator stays
    usable: every rank has counted the call, and its late messages are discarded.
    """


class CollectiveMismatchError(CollectiveError):
    """Ranks of one communicator called different collectives, or the same one with
    arguments MPI requires to agree (root, op, datatype, count); the message names both
    calls, e.g. ``rank 0 is in Bcast(root=0, float64x1000), rank 1 in Allreduce(SUM,
    float64x1000)``."""


class ThreadLevelError(CommError):
    """A second thread called pycomm while another thread of the same rank was waiting in a
    blocking call: pycomm provides ``THREAD_SERIALIZED``, not ``THREAD_MULTIPLE``.

    Raised in the second thread before its call changes anything; the waiting thread's
    call goes on, and the communicator stays usable (the refused call may be made again
    once the other thread has returned). ``pycomm.MPI`` raises it as ``MPI.Exception`` of
    class ``MPI.ERR_OTHER``. Attributes: ``rank`` (world rank), ``holder`` and ``caller``
    (the two threads' names).
    """


class ProtocolError(CommError):
    """A peer sent something that breaks the wire protocol (bad header, failed auth)."""


class RemoteError(CommError):
    """A rank started by :func:`pycomm.spawn` raised; carries its rank and traceback text."""

    def __init__(self, rank: int, exc_type: str, message: str, traceback_text: str):
        super().__init__(f"rank {rank} raised {exc_type}: {message}\n"
                         f"--- traceback from rank {rank} ---\n{traceback_text}")
        self.rank = rank
        self.exc_type = exc_type
        self.remote_traceback = traceback_text


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (PEP 678, Python 3.11+). On Python 3.10, which has no
    ``add_note``, the note goes to ``exc.__notes__`` as 3.11 keeps it, and onto the end of
    a text first argument, where a 3.10 traceback shows it."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return
    exc.__notes__ = [*getattr(exc, "__notes__", []), note]
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]}\n{note}", *exc.args[1:])
