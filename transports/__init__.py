"""Byte movers for pycomm: each transport carries framed messages between two ranks.

This package never imports :mod:`pycomm`. It knows nothing of tags, communicators or
collectives: a transport connects this rank to its peers (addresses exchanged through a
:class:`~transports.base.Store`) and moves one message at a time, a small header and a
contiguous payload, reliably and in order per (sender, receiver) pair.

Transports, in the order ``auto`` prefers them:

* ``shm`` (:mod:`transports.shm`): ranks of one host, through shared-memory rings and,
  for large messages, Linux cross-memory attach (one copy).
* ``tcp`` (:mod:`transports.tcp`): any two ranks, through authenticated TCP connections.

Not part of ``auto``, chosen by name only:

* ``rdma`` (:mod:`transports.rdma`): emulated RDMA queue pairs (verbs over a software NIC).
"""

from .base import (  # noqa: F401
    HandshakeError, PeerLostError, RemoteAccessError, Sink, Store, Transport, TransportError,
    host_identity,
)

__all__ = ["Transport", "Sink", "Store", "TransportError", "PeerLostError", "HandshakeError",
           "RemoteAccessError", "host_identity", "get_transport_class", "TRANSPORTS"]

TRANSPORTS = ("shm", "tcp", "rdma")


def get_transport_class(name: str) -> type[Transport]:
    """Return the transport class registered under ``name`` ("shm", "tcp" or "rdma").

    Raises:
        KeyError: no transport has that name.
    """
    if name == "shm":
        from .shm import ShmTransport
        return ShmTransport
    if name == "tcp":
        from .tcp import TcpTransport
        return TcpTransport
    if name == "rdma":
        from .rdma.transport import RdmaTransport
        return RdmaTransport
    raise KeyError(f"unknown transport {name!r}; known: {', '.join(TRANSPORTS)}")
