"""Client and server (MPI-4.1 section 11.9): ``Open_port``, ``Close_port``,
``Intracomm.Accept``, ``Intracomm.Connect``, ``Publish_name``, ``Lookup_name``,
``Unpublish_name`` and ``Comm.Join`` in mpi4py's API.

**A port** is a rendezvous store (:class:`pycomm.launch.store.StoreServer`) served by the
process that opened it, at ``PYCOMM_HOST`` if set, else on loopback for a one-host job
and on this process's TCP address for a job across hosts (a client job on another host
needs ``PYCOMM_HOST`` on the server's side); its name,
``pycomm-port:<address>:<tcp port>:<secret hex>``, is all that a client needs.
``Connect``'s root takes a ticket (a store counter), posts its group's size and waits for
the answer; ``Accept``'s root serves the tickets in order, answering with a new bridge
job id and its own group's size. Both groups then join that bridge world through the
port's store (the accepting group as ranks ``0..p-1``, the connecting one as
``p..p+q-1``) and make the inter-communicator over it (:mod:`pycomm.MPI.bridge`). Both
calls wait up to ``PYCOMM_TIMEOUT`` seconds for the other side (MPI's wait forever). A
closed port refuses new connections (``ERR_PORT``); its store serves the bridges already
made until the process exits.

**Names** (``Publish_name``...) live in files of a per-user directory of this host
(``/tmp/pycomm-names-<uid>``, one per service, holding the port name), so that separate
jobs on one host find each other, as MPICH's Hydra name server lets the processes of one
``mpiexec``; a process unpublishes what it published at its exit.

**Join** (``Comm.Join(fd)``): the two processes of a connected socket swap a random
number and their pid over it; the larger serves a store (on the socket's local address)
and sends its address over the socket, and both join a two-rank bridge.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import urllib.parse
import uuid

import msgpack

import pycomm as _pycomm
from pycomm import config
from pycomm.errors import ArgumentError, CommError, CommTimeoutError

from .bridge import (bridge_job, bridge_name, check_root, decided_at_root, join_bridge, own,
                     reachable_address, transport_of)
from .exceptions import mpi_error

__all__ = ["Accept", "Connect", "accept", "close_port", "connect", "join", "lookup_name",
           "open_port", "publish_name", "unpublish_name"]

_PREFIX = "pycomm-port:"
_lock = threading.Lock()
_ports: dict[str, object] = {}          # port name -> its StoreServer (this process's)
_published: dict[str, str] = {}         # service -> port name (this process's)


def _store_server(host: str):
    from pycomm.launch.store import StoreServer
    token = secrets.token_hex(32)
    return StoreServer(token, host, 0), token


def open_port() -> str:
    """A new port served by this process (MPI_Open_port); its name (see the module
    docstring)."""
    server, token = _store_server(reachable_address(_pycomm.init()))
    name = f"{_PREFIX}{server.host}:{server.port}:{token}"
    with _lock:
        _ports[name] = server
    own(server.close)
    return name


def close_port(port_name: str) -> None:
    """Refuse new connections on a port this process opened (MPI_Close_port).

    Raises:
        MPI.Exception: ERR_PORT (not a port this process has open).
    """
    with _lock:
        server = _ports.pop(str(port_name), None)
    if server is None:
        raise mpi_error(ArgumentError, "ERR_PORT", f"Close_port: {port_name!r} is not a "
                        "port this process has open")
    host, port, token = _parse(port_name, "Close_port")
    with _client(host, port, token, "Close_port") as client:
        client.set("port/closed", b"1")


def _parse(port_name, w: str) -> tuple[str, int, str]:
    text = str(port_name)
    try:
        if not text.startswith(_PREFIX):
            raise ValueError
        host, port, token = text[len(_PREFIX):].rsplit(":", 2)
        return host, int(port), token
    except ValueError:
        raise mpi_error(ArgumentError, "ERR_PORT", f"{w}: {text!r} is not a port name "
                        f"(Open_port gives '{_PREFIX}<address>:<port>:<secret>')") from None


def _client(host: str, port: int, token: str, w: str, timeout: float | None = None):
    from pycomm.launch.store_client import StoreClient
    try:
        return StoreClient(host, port, token, timeout=timeout or float(
            config.get("PYCOMM_TIMEOUT")), wait_for_server=False)
    except CommError as exc:
        raise mpi_error(CommError, "ERR_PORT", f"{w}: port {host}:{port} cannot be "
                        f"reached: {exc}") from None


def accept(comm, port_name, root, w: str = "Accept"):
    """``comm.Accept(port_name, info, root)``: the next client of the port, collective
    over ``comm`` (``port_name`` counts at ``root``); returns the Intercomm (this group
    low, the client's remote)."""
    def serve(client, size: int, timeout: float):
        ticket = client.add("port/served", 1)
        try:
            request = msgpack.unpackb(client.get(f"port/req/{ticket}", timeout=timeout))
        except CommTimeoutError:
            client.add("port/served", -1)
            raise mpi_error(CommTimeoutError, "ERR_PORT", f"{w}: no client connected to "
                            f"the port within {timeout:g} s (PYCOMM_TIMEOUT)") from None
        job_id = f"{_pycomm.init()._engine.job_id}-c{uuid.uuid4().hex[:8]}"
        client.set(f"port/rep/{ticket}", msgpack.packb([job_id, size]))
        return job_id, size, request[0]
    return _meet(comm, port_name, root, w, serve, True)


def connect(comm, port_name, root, w: str = "Connect"):
    """``comm.Connect(port_name, info, root)``: join the server that accepts on the port,
    collective over ``comm``; returns the Intercomm (the server's group remote)."""
    def ask(client, size: int, timeout: float):
        if client.wait(["port/closed"], timeout=0.0):
            raise mpi_error(CommError, "ERR_PORT", f"{w}: port {port_name!r} is closed")
        ticket = client.add("port/tickets", 1)
        client.set(f"port/req/{ticket}", msgpack.packb([size]))
        try:
            job_id, servers = msgpack.unpackb(client.get(f"port/rep/{ticket}",
                                                         timeout=timeout))
        except CommTimeoutError:
            raise mpi_error(CommTimeoutError, "ERR_PORT", f"{w}: no server accepted on the "
                            f"port within {timeout:g} s (PYCOMM_TIMEOUT)") from None
        return job_id, servers, size
    return _meet(comm, port_name, root, w, ask, False)


def _meet(comm, port_name, root, w: str, exchange, accepting: bool):
    """What Accept and Connect share: ``exchange(store client, this group's size,
    timeout) -> (bridge job id, servers, clients)`` at ``root`` through the port's
    store, the answer agreed over ``comm``, then the bridge (the accepting group low)."""
    from .intercomm import Intercomm
    inner = comm._inner(w)
    root = check_root(inner, root, w)
    timeout = float(config.get("PYCOMM_TIMEOUT"))

    def at_root():
        host, port, token = _parse(port_name, w)
        with _client(host, port, token, w) as client:
            try:
                return (host, port, token, *exchange(client, inner.size, timeout))
            except CommError as exc:
                if hasattr(exc, "Get_error_class"):     # ours, with its class already
                    raise
                # the port's store went away meanwhile: its process ended
                raise mpi_error(CommError, "ERR_PORT", f"{w}: port {host}:{port}: "
                                f"{exc}") from None
    host, port, token, job_id, servers, clients = decided_at_root(inner, root, at_root, w)
    size = servers + clients
    rank = inner.rank if accepting else servers + inner.rank
    link = join_bridge(bridge_job(rank, size, host, port, token, job_id), servers,
                       f"{comm.Get_name()}.{w}",
                       bridge_name("MPI_Comm_accept", servers, size, "server", "client"),
                       transport_of(inner))
    return Intercomm._wrap(link)


# -- the methods of MPI.Intracomm --------------------------------------------------------
def Accept(self, port_name: str, info=None, root: int = 0):
    """Accept the next client of ``port_name`` (MPI_Comm_accept; collective, the port
    counts at ``root``); see :mod:`pycomm.MPI.ports`.

    Returns:
        MPI.Intercomm: this group local, the connecting group remote.

    Raises:
        MPI.Exception: ERR_PORT (a bad port name, or no client within
            ``PYCOMM_TIMEOUT``), ERR_ROOT.
    """
    return accept(self, port_name, root)


def Connect(self, port_name: str, info=None, root: int = 0):
    """Connect to the group accepting on ``port_name`` (MPI_Comm_connect; collective,
    the port counts at ``root``); see :mod:`pycomm.MPI.ports`.

    Returns:
        MPI.Intercomm: this group local, the accepting group remote.

    Raises:
        MPI.Exception: ERR_PORT (a bad, closed or unreachable port, or no server
            accepting within ``PYCOMM_TIMEOUT``), ERR_ROOT.
    """
    return connect(self, port_name, root)


# -- names ----------------------------------------------------------------------------
def _names_dir() -> str:
    path = os.path.join("/tmp", f"pycomm-names-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _name_file(service) -> str:
    return os.path.join(_names_dir(), urllib.parse.quote(str(service), safe=""))


def publish_name(service, port_name) -> None:
    """Publish ``port_name`` under ``service`` on this host (MPI_Publish_name).

    Raises:
        MPI.Exception: ERR_SERVICE (the service is published already).
    """
    path = _name_file(service)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise mpi_error(ArgumentError, "ERR_SERVICE", f"Publish_name: service {service!r} "
                        "is published already") from None
    with os.fdopen(fd, "w") as f:
        f.write(str(port_name))
    first = False
    with _lock:
        first = not _published
        _published[str(service)] = str(port_name)
    if first:
        own(_unpublish_all)


def lookup_name(service) -> str:
    """The port published under ``service`` on this host (MPI_Lookup_name).

    Raises:
        MPI.Exception: ERR_NAME (nothing is published under it).
    """
    try:
        with open(_name_file(service)) as f:
            return f.read()
    except FileNotFoundError:
        raise mpi_error(ArgumentError, "ERR_NAME", f"Lookup_name: no port is published as "
                        f"{service!r}") from None


def unpublish_name(service, port_name) -> None:
    """Withdraw ``service`` (MPI_Unpublish_name).

    Raises:
        MPI.Exception: ERR_SERVICE (not published, or under another port).
    """
    path = _name_file(service)
    try:
        with open(path) as f:
            published = f.read()
    except FileNotFoundError:
        published = None
    if published != str(port_name):
        raise mpi_error(ArgumentError, "ERR_SERVICE", f"Unpublish_name: service "
                        f"{service!r} is not published with port {port_name!r}")
    os.unlink(path)
    with _lock:
        _published.pop(str(service), None)


def _unpublish_all() -> None:
    with _lock:
        left = dict(_published)
        _published.clear()
    for service, port in left.items():
        try:
            if open(_name_file(service)).read() == port:
                os.unlink(_name_file(service))
        except OSError:
            pass


# -- Join -----------------------------------------------------------------------------
def join(fd: int):
    """``Comm.Join(fd)``: the inter-communicator of this process and the one at the other
    end of the connected socket ``fd`` (see the module docstring); the socket is left open.

    Raises:
        MPI.Exception: ERR_ARG (``fd`` is not a connected socket), ERR_OTHER (the peer
            closed it or sent something else).
    """
    from .intercomm import Intercomm
    w = "Join"
    try:
        sock = socket.socket(fileno=os.dup(int(fd)))
    except OSError as exc:
        raise mpi_error(ArgumentError, "ERR_ARG", f"{w}: fd {fd} is not a socket: {exc}") \
            from None
    try:
        sock.settimeout(float(config.get("PYCOMM_TIMEOUT")))
        mine = [secrets.randbits(62), os.getpid()]
        _send(sock, mine)
        theirs = _recv(sock, w)
        if theirs == mine:
            raise mpi_error(CommError, "ERR_OTHER", f"{w}: both ends drew the same number")
        serve = mine > theirs
        if serve:
            server, token = _store_server(sock.getsockname()[0])
            own(server.close)
            job_id = f"{_pycomm.init()._engine.job_id}-j{uuid.uuid4().hex[:8]}"
            where = [server.host, server.port, token, job_id]
            _send(sock, where)
        else:
            where = _recv(sock, w)
    except OSError as exc:
        raise mpi_error(CommError, "ERR_OTHER", f"{w}: the socket failed: {exc}") from None
    finally:
        sock.close()
    host, port, token, job_id = where
    rank = 0 if serve else 1
    link = join_bridge(bridge_job(rank, 2, host, port, token, job_id), 1, "MPI_Comm_join",
                       bridge_name("MPI_Comm_join", 1, 2, "serving", "joining"),
                       config.get("PYCOMM_TRANSPORT"))
    return Intercomm._wrap(link)


def _send(sock, obj) -> None:
    body = msgpack.packb(obj)
    sock.sendall(len(body).to_bytes(4, "big") + body)


def _recv(sock, w: str):
    def exactly(n):
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise mpi_error(CommError, "ERR_OTHER", f"{w}: the peer closed the socket")
            out += chunk
        return out
    n = int.from_bytes(exactly(4), "big")
    if n > 4096:
        raise mpi_error(CommError, "ERR_OTHER", f"{w}: the peer sent {n} bytes, not a "
                        "pycomm Join")
    return msgpack.unpackb(exactly(n))
