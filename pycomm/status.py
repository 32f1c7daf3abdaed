"""The status of a received message: mpi4py's ``Status`` (source, tag, byte count)."""

from __future__ import annotations

import numpy as np

from .p2p import ANY_SOURCE, ANY_TAG

__all__ = ["Status", "fill"]


class Status:
    """Where a received message came from (mpi4py's ``Status``).

    Attributes:
        source: sender's rank in the communicator.
        tag: the message's tag.
        count: bytes received.
        error: 0 (MPI_SUCCESS); errors are raised, not stored.
    """

    __slots__ = ("source", "tag", "count", "error", "cancelled")

    def __init__(self):
        self.source, self.tag, self.count, self.error = ANY_SOURCE, ANY_TAG, 0, 0
        self.cancelled = False

    def Get_source(self) -> int:
        """Return the rank that sent the message (in the receiving communicator).

        Returns:
            int: a rank, PROC_NULL, or ANY_SOURCE when nothing was received into this Status.

        Raises:
            Nothing.
        """
        return self.source

    def Get_tag(self) -> int:
        """Return the message's tag.

        Returns:
            int: the tag, or ANY_TAG when nothing was received into this Status.

        Raises:
            Nothing.
        """
        return self.tag

    def Get_error(self) -> int:
        """Return the operation's error code: always 0 (MPI_SUCCESS).

        pycomm raises its errors instead of storing them.

        Returns:
            int: 0.

        Raises:
            Nothing.
        """
        return self.error

    def Get_count(self, datatype=None) -> int:
        """Return the received size in elements of ``datatype`` (also ``Get_elements``).

        Args:
            datatype: a numpy dtype (or anything ``np.dtype`` accepts), or None for bytes.

        Returns:
            int: bytes received // the dtype's itemsize (bytes when ``datatype`` is None).

        Raises:
            TypeError: ``datatype`` is not a numpy dtype.
        """
        if datatype is None:
            return self.count
        return self.count // np.dtype(datatype).itemsize

    Get_elements = Get_count

    def Is_cancelled(self) -> bool:
        """Return whether the operation was cancelled (:meth:`Request.Cancel` took effect).

        Returns:
            bool: True when cancelled.

        Raises:
            Nothing.
        """
        return self.cancelled

    def __repr__(self) -> str:
        return f"Status(source={self.source}, tag={self.tag}, count={self.count})"


def fill(status: Status | None, source: int, tag: int, count: int) -> None:
    """Set ``status`` (when given) to a received message's source, tag and byte count."""
    if status is not None:
        status.source, status.tag, status.count = source, tag, count
