"""Inter-communicators between groups that did not share a world: the bridge worlds of
``Spawn`` (:mod:`pycomm.MPI.spawn`), ``Accept``/``Connect`` and ``Join``
(:mod:`pycomm.MPI.ports`).

A bridge world is a pycomm world of both groups, low group first: its own job id, secret
and rendezvous store (served by one of its processes), joined with
:func:`pycomm.launch.bootstrap.create_world` from a :class:`~pycomm.launch.jobenv.JobEnv`
that the groups agreed on. On it each side makes, in the same order, a Split (its own
group: a spawned child's ``COMM_WORLD``; everyone else frees it at once) and a Dup, the
union of a :class:`BridgeLink`, the inter-communicator the call returns.

``Disconnect`` (``Free``) of a link is collective over both groups (MPI_Comm_disconnect):
a barrier, then each side frees the link and closes its bridge world, unless that world
is the process's own (a spawned child's) or a communicator made from the link (a
``Merge``...) is still alive on it: the bridge then stays open until the process exits. A process that exits closes the bridges it
still holds first (a peer waiting on it then fails, naming it), then what it served for
others (:func:`own`: a spawn's children, which it waits for; a port's store).

Groups of a link are in bridge ranks: ``Get_remote_group()`` lists the other side as
bridge ranks, which are not ranks of this process's own ``COMM_WORLD``.
"""

from __future__ import annotations

import atexit
import threading

import pycomm as _pycomm
from pycomm import config
from pycomm import trace as _trace

from pycomm.errors import ArgumentError, CommError

from .exceptions import mpi_error
from .interlink import InterLink

__all__ = ["BridgeLink", "bridge_job", "bridge_name", "check_root", "decided_at_root",
           "join_bridge", "own", "reachable_address", "transport_of"]

_lock = threading.Lock()
_links: list[BridgeLink] = []          # links whose bridge this process closes
_owned: list = []                      # closers of what this process serves, run at exit
_armed = False


class BridgeLink(InterLink):
    """An :class:`~pycomm.MPI.interlink.InterLink` over a bridge world whose ``Free`` is
    ``MPI_Comm_disconnect`` (see the module docstring).

    Args:
        union: a Dup of the bridge world (the low group first).
        nlow: the low group's size.
        low: whether this process is in the low group.
        name: the link's name.
        closer: the function closing this process's bridge world (None: it is the
            process's own world).
        on_free: called once the link is freed (a spawned child forgets its parent).
    """

    def __init__(self, union, nlow: int, low: bool, name: str, closer=None, on_free=None,
                 world=None):
        super().__init__(union, nlow, low, name)
        self._closer, self._on_free, self._world = closer, on_free, world

    def Free(self) -> None:
        """Disconnect: a barrier with the other group, then free the link and close the
        bridge world.

        Raises:
            PeerError: a process of the other group exited first.
            CommTimeoutError: the other group did not disconnect within ``PYCOMM_TIMEOUT``.
        """
        if self._freed:
            return
        try:
            self.coll.Barrier()
        finally:
            super().Free()
            if self._on_free is not None:
                self._on_free(self)
            if not self._still_used():
                self._close_bridge()
                with _lock:
                    if self in _links:
                        _links.remove(self)

    def _still_used(self) -> bool:
        """Whether a communicator made from this link (a ``Merge``, a ``Split``...) is
        still alive on the bridge world: then the bridge stays open until this process
        exits, as the processes stay connected through it (MPI-4.1 11.10.4)."""
        return any(not c._freed and c is not self._world for c in self._engine.comms)

    def _close_bridge(self) -> None:
        if self._closer is not None:
            closer, self._closer = self._closer, None
            closer()


def check_root(inner, root, w: str) -> int:
    """``root`` as an int rank of ``inner`` (the Communicator of a spawn's or a port's
    group).

    Raises:
        MPI.Exception: ERR_ROOT (not a rank of it).
    """
    from .msgspec import as_int
    root = as_int(root, "root", w)
    if not 0 <= root < inner.size:
        raise mpi_error(ArgumentError, "ERR_ROOT", f"rank {inner.rank}: {w}: root={root} "
                        f"is not a rank of the communicator (0..{inner.size - 1})")
    return root


def decided_at_root(inner, root: int, at_root, w: str, code: str | None = None):
    """Run ``at_root()`` at ``root`` and broadcast its answer over ``inner``; return it.

    An error there is raised on every other rank (rather than leaving them waiting for
    the root) as ``MPI.Exception`` of class ``code`` (default: the root error's own class;
    ERR_OTHER for one that is not pycomm's) whose text names it, the root's
    ``ValueError``/``TypeError`` as "the root's arguments: ...". At the root it is raised
    as it is, but for a pycomm error given a ``code``, which takes that class there too.
    """
    verdict = mine = None
    if inner.rank == root:
        try:
            verdict = ("ok", at_root())
        except Exception as exc:        # noqa: BLE001 (each one is handed on, then raised)
            mine = exc
            if isinstance(exc, CommError):
                from .exceptions import ERRORS, translate
                number = translate(exc).Get_error_class()
                name = next((k for k, v in ERRORS.items() if v == number), "ERR_OTHER")
                text = str(exc)
            else:
                name = "ERR_OTHER"
                text = (f"the root's arguments: {exc}" if isinstance(exc, (ValueError,
                        TypeError)) else f"{type(exc).__name__}: {exc}")
            verdict = ("error", name, text)
    verdict = inner.bcast(verdict, root)
    if verdict[0] == "ok":
        return verdict[1]
    if mine is not None and (code is None or not isinstance(mine, CommError)):
        raise mine          # (with a ``code``, the root's own pycomm error takes it too)
    text = verdict[2]
    if not text.startswith(f"{w}: "):
        text = f"{w}: {text}"
    raise mpi_error(CommError, code or verdict[1], f"rank {inner.rank}: {text}")


def bridge_job(rank: int, size: int, host: str, port: int, token: str, job_id: str):
    """The :class:`~pycomm.launch.jobenv.JobEnv` of bridge rank ``rank`` (``token``:
    the secret in hex)."""
    from pycomm.launch.jobenv import JobEnv
    return JobEnv(rank, size, host, port, bytes.fromhex(token), job_id, "pycomm",
                  local_rank=rank, local_size=size)


def transport_of(inner) -> str:
    """The transport choice a bridge of ``inner``'s processes makes (``inner``'s own)."""
    return getattr(inner, "transport", None) or config.get("PYCOMM_TRANSPORT")


def reachable_address(comm) -> str:
    """Where a store serving ``comm``'s processes listens: ``PYCOMM_HOST`` if set;
    loopback when they are all on this host; else the address this process's TCP links
    listen on, which their hosts reach already."""
    given = config.get("PYCOMM_HOST")
    if given:
        return given
    layout = getattr(comm, "host_layout", None)
    if layout is not None and layout.nhosts > 1:
        for t in comm._engine.transports:
            if t.name in ("tcp", "rdma") and getattr(t, "host", None):
                return t.host
    return "127.0.0.1"


def bridge_name(what: str, nlow: int, size: int, low: str, high: str) -> str:
    """A bridge world's name, which its ranks' errors carry: which ranks are which."""
    return f"{what} bridge [{low} 0..{nlow - 1}, {high} {nlow}..{size - 1}]"


def join_bridge(job, nlow: int, name: str, world_name: str, transport: str) -> BridgeLink:
    """Join the bridge world ``job`` (this process's rank in it is ``job.rank``) and make
    the link over it, in the steps the other side takes (see the module docstring).

    Args:
        job: the bridge's :class:`~pycomm.launch.jobenv.JobEnv`.
        nlow: the low group's size (ranks ``0..nlow-1``).
        name: the link's name.
        world_name: the bridge world's name (:func:`bridge_name`).
        transport: the transport choice ("auto", "shm", "tcp", "rdma").

    Raises:
        CommError: the bridge could not be formed (a peer unreachable, a timeout).
    """
    from pycomm.launch.bootstrap import create_world
    arm()
    own_rank = _pycomm.init().rank
    bridge, closer = create_world(job, transport=transport)
    _trace.install(own_rank)            # (create_world set the bridge rank for the trace)
    bridge.name = world_name
    low = job.rank < nlow
    try:
        bridge.Split(0 if low else 1, bridge.rank).Free()   # each group's own, unused here
        link = BridgeLink(bridge.Dup(), nlow, low, name, closer, world=bridge)
    except BaseException:
        closer()
        raise
    with _lock:
        _links.append(link)
    return link


def own(close) -> None:
    """Run ``close()`` at this process's exit, after its bridges are closed (a spawn's
    children, a port's store)."""
    arm()
    with _lock:
        _owned.append(close)


def _at_exit() -> None:
    with _lock:
        links, owned = list(_links), list(_owned)
        _links.clear()
        _owned.clear()
    for link in links:
        link._close_bridge()
    for close in owned:
        close()


def arm() -> None:
    """Register the exit step (once; after pycomm's own, so that it runs first)."""
    global _armed
    _pycomm.init()      # (its finalize is registered first, so this exit step runs first)
    with _lock:
        if not _armed:
            _armed = True
            atexit.register(_at_exit)
