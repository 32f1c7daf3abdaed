"""Building the world communicator from the environment.

Which launcher started the process, and where the rendezvous store is, comes from
:func:`pycomm.launch.jobenv.detect` (that module's docstring has the table of launchers).

Listening address (tcp and rdma): ``PYCOMM_HOST`` when set; else loopback when the store is
on loopback (a single-host job); else the address of the interface that routes to the
store's host (:func:`~pycomm.launch.jobenv.listen_address`), which every host of a cluster can reach back.
On the store's own host, a name that resolves to loopback there (Debian's ``127.0.1.1
node01`` line in /etc/hosts, while the other hosts resolve node01 to its real address)
yields loopback; the ranks of that host then listen on the address the other hosts
resolved the store's host to, when it is one of this host's (:func:`_address_others_reach`).
``PYCOMM_PORT_RANGE=lo-hi`` pins the TCP transport's listening ports.

Start-up: every rank publishes its host identity, each pair of ranks picks the first
transport in the preference list that can link them (``auto``: shm inside a host, tcp
across hosts), transports connect, and an init barrier runs over the new communicator.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
from dataclasses import dataclass

import msgpack
import numpy as np

from transports import TransportError, get_transport_class, host_identity
from transports.shmring import fitted_ring_bytes, rings_bytes, shm_free

from .. import config, shmcoll, trace
from . import pmi, pmix
from .jobenv import JobEnv, _check_store_host, _is_loopback, detect, listen_address
from .rlimits import raise_open_files_limit
from ..errors import ArgumentError, CommError
from ..buffers import IN_PLACE as pycomm_IN_PLACE
from ..ops import MAX as _MAX
from ..p2p import Engine, default_spin_seconds, default_yield_seconds
from ..stall import Inspector
from ..waiting import available_cores

__all__ = ["HostLayout", "create_world", "host_layout"]


_INSPECTOR_CONNECT_S = 3.0  # seconds the stall inspector's store clients take to connect
_PMI_KEY = "pycomm-store"   # rank 0's "address,port,secret hex" (or "error,host,why") in PMI


def _own_address(je: JobEnv) -> str:
    """An IPv4 address of this host (rank 0's) for the other hosts to reach its store.

    ``MASTER_ADDR`` or ``PYCOMM_HOST`` when set; else what the name Hydra knows this host by
    (``PMI_HOSTNAME``, Open MPI 5's ``PMIX_HOSTNAME``), then this host's name, resolves to,
    the first non-loopback address this host can bind (the names by which the launcher
    reached the hosts are the ones the hosts resolve; MPICH's TCP netmod takes its address
    from the hostname alike).

    Raises:
        ArgumentError: no name resolves to such an address (each name and why, what to set).
    """
    given = je.master_addr or config.get("PYCOMM_HOST")
    if given:
        return given
    if je.local_size is not None and je.local_size >= je.size:
        return "127.0.0.1"              # every rank is on this host
    tried = []
    for name in dict.fromkeys(n for n in (je.host_name, socket.gethostname()) if n):
        try:
            ips = dict.fromkeys(i[4][0] for i in socket.getaddrinfo(
                name, None, socket.AF_INET, socket.SOCK_STREAM))
        except OSError as exc:
            tried.append(f"{name} does not resolve ({exc})")
            continue
        for ip in ips:
            if _is_loopback(ip):
                tried.append(f"{name} is {ip}, a loopback address")
                continue
            try:
                with socket.socket() as probe:
                    probe.bind((ip, 0))
                return ip
            except OSError:
                tried.append(f"{name} is {ip}, not an address of this host")
    five = isinstance(je.pmi, (pmix.Endpoint, pmix.Client))
    raise ArgumentError(
        f"mpiexec ({'Open MPI 5' if five else 'Hydra'}): rank 0 (host {socket.gethostname()}) "
        f"found no address of its own for the other hosts to reach its store: "
        f"{'; '.join(tried) or 'no name to resolve'}; set PYCOMM_HOST to rank 0's address, "
        "or MASTER_ADDR to rank 0's host on every rank (mpiexec "
        f"{'-x MASTER_ADDR=node01' if five else '-genv MASTER_ADDR node01'} ...)")


def _pmi_rendezvous(je: JobEnv, timeout: float):
    """Learn the store's address, port and secret from rank 0 through Hydra's PMI (or
    Open MPI 5's PMIx: :class:`pycomm.launch.pmix.Client` has the same put, barrier, get).

    Rank 0 starts the store (on ``MASTER_PORT + 1`` if given, else a free port), publishes
    ``address,port,secret`` under :data:`_PMI_KEY`, or ``error,host,reason`` if it cannot;
    every rank then passes a PMI barrier and reads it, so a failing rank 0 stops every rank
    at once with its reason. The PMI connection is finalized and closed before returning.

    Args:
        je: a JobEnv with ``pmi`` set (from :func:`~pycomm.launch.jobenv.detect`).
        timeout: seconds each PMI exchange may take; the barrier waits for every rank.

    Returns:
        (job, server): the JobEnv with the store's address, port, token and a job id from
        the PMI space's name; rank 0's running StoreServer, None on the others.

    Raises:
        ArgumentError: rank 0 found no address of its own (on every rank, with rank 0's
            reason); CommError / CommTimeoutError: PMI failed or timed out.
    """
    from dataclasses import replace
    import secrets

    from .store import StoreServer

    server, failure = None, None
    client = je.pmi if isinstance(je.pmi, (pmi.Client, pmix.Client)) else \
        pmix.Client(je.pmi, timeout) if isinstance(je.pmi, pmix.Endpoint) else \
        pmi.Client(je.pmi, timeout)
    with client:
        try:
            if je.rank == 0:
                try:
                    addr = _own_address(je)
                    token = je.token or secrets.token_bytes(32)
                    server = StoreServer(token, host="127.0.0.1" if _is_loopback(addr)
                                         else "0.0.0.0", port=je.master_port or 0)
                    value = f"{addr},{server.port},{'' if je.token else token.hex()}"
                except Exception as exc:            # noqa: BLE001 - told to every rank
                    failure = exc
                    value = pmi.fit(f"error,{socket.gethostname()},"
                                    f"{type(exc).__name__}: {exc}")
                client.put(_PMI_KEY, value)
            client.barrier()
            value = client.get(_PMI_KEY)
        except BaseException:
            if server is not None:
                server.close()
            raise
    if isinstance(failure, CommError):
        raise failure
    if failure is not None:
        raise CommError(f"rank 0: cannot serve the job's rendezvous store: "
                        f"{type(failure).__name__}: {failure}") from failure
    fields = value.split(",", 2)
    if fields[0] == "error" and len(fields) == 3:
        kind = ArgumentError if fields[2].startswith("ArgumentError:") else CommError
        raise kind(f"rank {je.rank}: rank 0 (host {fields[1]}) cannot serve the job's "
                   f"rendezvous store: {fields[2]}")
    try:
        addr, port, secret = fields
        port = int(port)
        token = je.token or bytes.fromhex(secret)
    except ValueError:
        if server is not None:
            server.close()
        raise CommError(f"rank {je.rank}: the PMI key {_PMI_KEY!r} holds {value!r}, not "
                        "rank 0's 'address,port,secret' (another program in this job used "
                        "the key?)") from None
    job_id = "m" + hashlib.sha256(client.kvsname.encode()).hexdigest()[:12]
    return replace(je, master_addr=addr, master_port=port, token=token, job_id=job_id,
                   pmi=None), server


@dataclass(frozen=True)
class HostLayout:
    """Which ranks of the world share a host (a kernel and /dev/shm), seen from one rank.

    Hosts are numbered by their lowest rank. ``hosts[h]`` lists host h's ranks in increasing
    order; this rank is ``hosts[host][local_rank]``. E.g. 2 hosts x 2 ranks, cyclic
    placement, rank 2: hosts=((0, 2), (1, 3)), host=0, local_rank=1.
    """

    hosts: tuple[tuple[int, ...], ...]
    names: tuple[str, ...]          # each host's hostname, for messages
    host: int
    local_rank: int

    @property
    def local_size(self) -> int:
        return len(self.hosts[self.host])

    @property
    def nhosts(self) -> int:
        return len(self.hosts)

    def restrict(self, members, rank: int) -> "HostLayout":
        """The layout of a communicator made of some of this layout's ranks, computed
        locally (every rank knows the whole layout, so no message is needed).

        Args:
            members: this layout's ranks, in the new communicator's rank order (new rank
                ``i`` is old rank ``members[i]``).
            rank: this process's rank in the new communicator.

        Returns:
            The new communicator's layout: hosts renumbered by their lowest new rank,
            hostnames kept.

        Raises:
            ValueError: a member is not a rank of this layout, or ``rank`` is out of range.
        """
        host_of = {r: h for h, group in enumerate(self.hosts) for r in group}
        groups: dict[int, list[int]] = {}
        for new, old in enumerate(members):
            if old not in host_of:
                raise ValueError(f"rank {old} is not in the layout {self.hosts}")
            groups.setdefault(host_of[old], []).append(new)
        if not 0 <= rank < len(members):
            raise ValueError(f"rank {rank} is out of range for {len(members)} members")
        order = sorted(groups.items(), key=lambda kv: kv[1][0])
        hosts = tuple(tuple(g) for _, g in order)
        host = next(h for h, (_, g) in enumerate(order) if rank in g)
        return HostLayout(hosts, tuple(self.names[h] for h, _ in order), host,
                          hosts[host].index(rank))


def host_layout(infos: list[dict], rank: int) -> HostLayout:
    """Group the ranks' published start-up infos (``host`` identity, ``hostname``) by host."""
    groups: dict[str, list[int]] = {}
    for r, info in enumerate(infos):
        groups.setdefault(info["host"], []).append(r)
    hosts = tuple(tuple(g) for g in sorted(groups.values(), key=lambda g: g[0]))
    host = next(h for h, g in enumerate(hosts) if rank in g)
    names = tuple(str(infos[g[0]].get("hostname") or infos[g[0]]["host"].split("/")[0])
                  for g in hosts)
    return HostLayout(hosts, names, host, hosts[host].index(rank))


def _store_ip(master_addr: str | None) -> str | None:
    """The IPv4 address ``master_addr`` resolves to on this host (None: it does not)."""
    if not master_addr:
        return None
    try:
        return socket.getaddrinfo(master_addr, None, socket.AF_INET)[0][4][0]
    except OSError:
        return None


def _is_own_address(ip: str) -> bool:
    try:
        with socket.socket() as probe:
            probe.bind((ip, 0))
        return True
    except OSError:
        return False


def _address_others_reach(rank: int, infos: list[dict]) -> str | None:
    """The address by which ranks of other hosts reach this host, if this is the store's
    host: what they resolved the store's host to (``store_ip`` of their start-up infos),
    when that is an address of this host; None if no such rank or address.

    Under SLURM or torchrun the store's host is a name (node01); where this host resolves
    its own name to loopback (Debian's ``127.0.1.1 node01`` line), the route to it is
    loopback too, and a rank listening there could not be reached from the other hosts.
    """
    mine = infos[rank]["host"]
    for ip in dict.fromkeys(i.get("store_ip") for i in infos if i["host"] != mine):
        if ip and not _is_loopback(ip) and _is_own_address(ip):
            return ip
    return None


def _host_room(rank: int, infos: list[dict]) -> tuple[int, int]:
    """``(ranks, room)``: how many ranks share this rank's host, and the least /dev/shm
    room any of them saw (-1: one cannot write there), from what all published."""
    mine = infos[rank]["host"]
    local = [i for i in infos if i["host"] == mine]
    return len(local), min(i.get("shm_free", 0) for i in local)


def _shm_refused(rank: int, infos: list[dict], ring_bytes: int, coll_bytes: int) -> str | None:
    """Why the ranks of this rank's host cannot use shared memory (then ``auto`` links
    them over TCP), or None: a rank there cannot write /dev/shm, or its room (the least
    any of them saw) is less than their segments reserve at start-up, each with its
    inbound rings and the world's block of slots (transports/shmring.py, "Room"). Every
    rank decides from what all published before any segment was made, so all agree."""
    ranks, free = _host_room(rank, infos)
    if ranks < 2:
        return None
    if free < 0:
        return "/dev/shm cannot be written (mount a writable tmpfs there)"
    block = coll_bytes // shmcoll.MAX_COMMS     # the world's slots in each segment
    need = ranks * (rings_bytes(ranks - 1, ring_bytes) + block)
    if free >= need:
        return None
    return (f"/dev/shm has {free >> 20} MiB free, and shared memory between this host's "
            f"{ranks} ranks needs {-(-need >> 20)} MiB ({ranks - 1} rings of "
            f"{ring_bytes} bytes a rank; make /dev/shm larger, "
            "docker run --shm-size=1g, or the rings smaller)")


def _ring_bytes(rank: int, infos: list[dict], options: dict, coll_bytes: int,
                transport: str) -> int:
    """The bytes of each shared-memory ring on this rank's host: ``ring_bytes=`` or
    ``PYCOMM_SHM_RING_BYTES`` where given; else the default, made smaller where the
    host's /dev/shm is small (:func:`transports.shmring.fitted_ring_bytes`), which the
    host's lowest rank says once (where ``transport`` may take shared memory). The ranks
    of a host decide alike (from the room they published)."""
    given = options.get("ring_bytes") or config.explicit("PYCOMM_SHM_RING_BYTES")
    if given:
        return int(given)
    default = config.get("PYCOMM_SHM_RING_BYTES")
    ranks, free = _host_room(rank, infos)
    if ranks < 2 or free < 0 or transport not in ("auto", "shm"):
        return default
    ring = fitted_ring_bytes(ranks, free, default, coll_bytes // shmcoll.MAX_COMMS)
    lowest = min(r for r, i in enumerate(infos) if i["host"] == infos[rank]["host"])
    if ring < default and rank == lowest and not _shm_refused(rank, infos, ring, coll_bytes):
        print(f"pycomm: /dev/shm has {free >> 20} MiB free: the {ranks} ranks of host "
              f"{socket.gethostname()} use shared-memory rings of {ring >> 10} KiB, not "
              f"{default >> 10} KiB (many messages in flight at once are slower; make "
              "/dev/shm larger, docker run --shm-size=1g; PYCOMM_SHM_RING_BYTES sets the "
              "size and silences this)", file=sys.stderr, flush=True)
    return ring


def _choose_transports(name: str, rank: int, infos: list[dict],
                       shm_refused: bool = False) -> dict[str, list[int]]:
    """Map transport name -> peers it serves, by the preference list for ``name``
    (``auto``: shm, else tcp; ``shm_refused``: tcp, see :func:`_shm_refused`)."""
    prefs = (["tcp"] if shm_refused else ["shm", "tcp"]) if name == "auto" else [name]
    chosen: dict[str, list[int]] = {}
    mine = infos[rank]
    for peer, theirs in enumerate(infos):
        if peer == rank:
            continue
        for tname in prefs:
            if get_transport_class(tname).can_connect(mine, theirs):
                chosen.setdefault(tname, []).append(peer)
                break
        else:
            raise CommError(f"rank {rank}: transport {name!r} cannot reach rank {peer} "
                            f"(host {theirs.get('host')!r}); use --transport tcp or auto")
    return chosen


def create_world(job: JobEnv | None = None, **options):
    """Create COMM_WORLD: connect to the store, link every peer, run the init barrier.

    Args:
        job: who this rank is and where the store is; default :func:`~pycomm.launch.jobenv.detect` (the
            environment). :mod:`pycomm.ray` passes its own.
        transport: "auto" (default, or ``PYCOMM_TRANSPORT``), "shm", "tcp" or "rdma".
        timeout: seconds for start-up and the default for every wait (``PYCOMM_TIMEOUT``).
        eager_limit: bytes (``PYCOMM_EAGER_LIMIT``).

    Returns:
        (communicator, closer): the world communicator and a function releasing it all.

    Raises:
        ArgumentError: an unknown option or transport; CommError: a peer unreachable.
    """
    from ..comm import Communicator

    known = {"transport", "timeout", "eager_limit", "ring_bytes", "spin_us", "host"}
    unknown = set(options) - known
    if unknown:
        raise ArgumentError(f"pycomm.init: unknown option(s) {sorted(unknown)}; known: "
                            f"{sorted(known)}")
    je = detect() if job is None else job
    _check_store_host(je)
    transport = options.get("transport") or config.get("PYCOMM_TRANSPORT")
    try:
        port_range = config.get("PYCOMM_PORT_RANGE")
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
    if transport not in ("auto", "shm", "tcp", "rdma"):
        raise ArgumentError(f"transport={transport!r} is invalid; use auto, shm, tcp or rdma")
    timeout = float(options.get("timeout") or config.get("PYCOMM_TIMEOUT"))
    local_size = config.get("PYCOMM_LOCAL_SIZE") or je.local_size or je.size
    spin_us = options.get("spin_us", config.get("PYCOMM_SPIN_US"))
    yield_us = config.get("PYCOMM_YIELD_US")
    engine = Engine(je.rank, je.size,
                    eager_limit=int(options.get("eager_limit")
                                    or config.get("PYCOMM_EAGER_LIMIT")),
                    spin_s=(spin_us * 1e-6 if spin_us is not None
                            else default_spin_seconds(local_size)),
                    yield_s=(yield_us * 1e-6 if yield_us is not None
                             else default_yield_seconds(local_size)),
                    timeout=timeout)
    engine.job_id = je.job_id
    raise_open_files_limit()    # a socket per remote peer, a segment per local one
    server = store = inspector = None
    try:
        if je.pmi is not None:
            je, server = _pmi_rendezvous(je, timeout)
        if je.size > 1:
            from .store import StoreServer
            from .store_client import StoreClient
            if je.host_store and server is None:
                server = StoreServer(je.token, host="0.0.0.0" if je.master_addr not in (
                    "127.0.0.1", "localhost") else "127.0.0.1", port=je.master_port)
            store = StoreClient(je.master_addr, je.master_port, je.token, timeout=timeout)
            given = options.get("host") or config.get("PYCOMM_HOST")
            listen = given or listen_address(je.master_addr, je.master_port)
            info = {"host": host_identity(), "hostname": socket.gethostname(),
                    "pid": os.getpid(), "store_ip": _store_ip(je.master_addr),
                    "shm_free": shm_free()}
            store.set(f"info/{je.job_id}/{je.rank}", msgpack.packb(info))
            infos = [msgpack.unpackb(store.get(f"info/{je.job_id}/{r}", timeout=timeout))
                     for r in range(je.size)]
            if not given and _is_loopback(listen) and not _is_loopback(je.master_addr):
                listen = _address_others_reach(je.rank, infos) or listen
            coll_bytes = shmcoll.area_bytes(config.get("PYCOMM_SHM_COLL_BYTES"))
            shm_opts = {"ring_bytes": _ring_bytes(je.rank, infos, options, coll_bytes,
                                                  transport),
                        "cma": config.get("PYCOMM_CMA"), "coll_bytes": coll_bytes}
            refused = transport == "auto" and _shm_refused(
                je.rank, infos, shm_opts["ring_bytes"], shm_opts["coll_bytes"])
            if refused and je.rank == min(r for r, i in enumerate(infos)
                                          if i["host"] == infos[je.rank]["host"]):
                print(f"pycomm: {refused}: the ranks of host {socket.gethostname()} talk "
                      "over TCP instead (slower for small messages); --transport tcp "
                      "silences this", file=sys.stderr, flush=True)
            for tname, peers in sorted(_choose_transports(transport, je.rank, infos,
                                                          bool(refused)).items(),
                                       key=lambda kv: ("shm", "tcp", "rdma").index(kv[0])):
                opts = {}
                if tname == "shm":
                    opts = shm_opts
                elif tname == "tcp":
                    opts = {"host": listen, "port_range": port_range,
                            "peer_timeout": config.get("PYCOMM_PEER_TIMEOUT"),
                            "remote_peers": [p for p in peers if infos[p]["host"] !=
                                             infos[je.rank]["host"]]}
                elif tname == "rdma":
                    opts = {"host": listen, "cma": config.get("PYCOMM_CMA"),
                            "read_timeout": timeout}
                t = get_transport_class(tname)(je.rank, je.size, je.job_id, je.token, engine,
                                               **opts)
                engine.attach(t, peers)     # attach first so close() releases it on error
                t.connect(store, peers, timeout)
        world = Communicator(engine, 0, list(range(je.size)), je.rank)
        world.transport = transport
        # The world's hosts (issue 16's first step towards hierarchical collectives).
        world.host_layout = (host_layout(infos, je.rank) if je.size > 1 else
                             host_layout([{"host": host_identity(),
                                           "hostname": socket.gethostname()}], 0))
        if je.size > 1:
            # Ranks per core on the busiest host, and the fewest cores of any host, agreed
            # by every rank: the cost model uses them, and all ranks must choose alike.
            mine = sum(1 for i in infos if i["host"] == infos[je.rank]["host"])
            cores = available_cores()
            agreed = np.array([mine / cores, -cores], dtype=np.float64)
            world.Allreduce(pycomm_IN_PLACE, agreed, op=_MAX)
            engine.oversubscription, engine.min_cores = float(agreed[0]), int(-agreed[1])
        world.transport_name = "+".join(t.name for t in engine.transports) or "self"
        world.Barrier()
        if store is not None:
            store.barrier(f"init/{je.job_id}", je.size, timeout)
        sigusr1 = trace.install(je.rank)
        if store is not None:           # the stall inspector reaches the store on its own
            addr, port, token = je.master_addr, je.master_port, je.token
            # The store is up by now: a client that cannot reach it within a few seconds
            # means its host is gone (under torchrun rank 0 hosts it), and one that refuses
            # means it is gone (its rank exited): the inspector's report of an error must
            # not hold the failing rank for the whole timeout.
            reach = min(timeout, _INSPECTOR_CONNECT_S)
            engine._inspector = inspector = Inspector(
                je.rank, je.size, je.job_id,
                lambda: StoreClient(addr, port, token, timeout=reach, wait_for_server=False),
                config.get("PYCOMM_STALL_WARN"), sigusr1, client=store)
            store = None                # its responder thread owns the start-up client now
    except TransportError as exc:
        engine.close()
        if server is not None:
            server.close()
        raise CommError(f"rank {je.rank}: could not start the world: {exc}") from exc
    except BaseException:
        if inspector is not None:
            inspector.close()
        engine.close()
        if server is not None:
            server.close()
        raise

    def close() -> None:
        from ..nbc import shutdown
        shutdown(engine)
        if inspector is not None:
            inspector.close()
        engine.close()
        if store is not None:
            store.close()
        if server is not None:
            server.close()

    return world, close
