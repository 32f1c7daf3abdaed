"""Building the world communicator from the environment.

Launchers understood, in this order (the first whose variables are set wins):

=============== ========================================= ================================
launcher        rank / size (local rank / size)           store address
=============== ========================================= ================================
pycomm          PYCOMM_RANK / PYCOMM_WORLD_SIZE           PYCOMM_MASTER_ADDR/PORT
                                                          (hosted by the launcher)
torchrun        RANK / WORLD_SIZE                         MASTER_ADDR, MASTER_PORT + 1
                (LOCAL_RANK / LOCAL_WORLD_SIZE)           (hosted by rank 0)
SLURM (srun)    SLURM_PROCID / SLURM_NTASKS               MASTER_ADDR or the first host of
                (SLURM_LOCALID / SLURM_STEP_TASKS_PER_    SLURM_STEP_NODELIST ('node[01-
                NODE at SLURM_NODEID, or SLURM_NTASKS_    04]' -> node01); MASTER_PORT + 1
                PER_NODE)                                 or a port from the job id
mpiexec, Hydra  PMI_RANK / PMI_SIZE                       one host: 127.0.0.1, a port from
                (MPI_LOCALRANKID / MPI_LOCALNRANKS)       the launcher's proxy; more hosts:
                                                          MASTER_ADDR and MASTER_PORT + 1,
                                                          else rank 0 publishes its address
                                                          and port through PMI (PMI_FD or
                                                          PMI_PORT; :mod:`pycomm.pmi`)
mpiexec, Open   OMPI_COMM_WORLD_RANK / _SIZE              MASTER_ADDR, else mpirun's host
MPI             (OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_     from OMPI_MCA_orte_hnp_uri (<= 4);
                SIZE)                                     port from MASTER_PORT + 1, the
                                                          HNP URI or PMIX_NAMESPACE (5)
mpiexec -pmi-   the proxy's answer on PMI_PORT for PMI_ID through PMI, as above (one host:
port (Hydra)    (MPI_LOCALRANKID / MPI_LOCALNRANKS)       127.0.0.1)
Ray             :mod:`pycomm.ray` builds the JobEnv       its group's directory actor
none            a world of size 1                         none
=============== ========================================= ================================

Where the store's host is derived (not given), rank 0 checks that it is an address of its
own host and says what to set when not (a non-block SLURM distribution, an mpirun on a
login node), rather than leaving the others to wait for a store nobody serves.

A multi-host Hydra job needs no ``MASTER_ADDR``: as MPI libraries do, the ranks use the
PMI connection Hydra gives each process. Rank 0 starts the store on a free port (or
``MASTER_PORT + 1``), publishes its address, port and a fresh job secret in the job's PMI
key-value space, and every rank reads them after a PMI barrier (the job id comes from the
space's name). The address is ``MASTER_ADDR`` or ``PYCOMM_HOST`` when set, else what the
name Hydra knows rank 0's host by (``PMI_HOSTNAME``, then the hostname) resolves to; when
that is loopback or not rank 0's, every rank stops with that reason and what to set. A
multi-host mpiexec that gives neither a PMI connection nor ``MASTER_ADDR`` (Open MPI 5) is
a clear error naming what to set.

``PYCOMM_MASTER_ADDR`` / ``PYCOMM_MASTER_PORT`` override the derived address for every
launcher. Under an external launcher rank 0 hosts the store in a background thread. The
job secret is ``PYCOMM_JOB_TOKEN``; under an external launcher that does not set it a
token is derived from the job's identifiers, which keeps strangers of other jobs out but is
not secret: export PYCOMM_JOB_TOKEN (same value on every rank) for real authentication.
Where the store is found through PMI, rank 0 draws a random secret and shares it there
instead (as private as the job's own PMI traffic).

Listening address (tcp and rdma): ``PYCOMM_HOST`` when set; else loopback when the store is
on loopback (a single-host job); else the address of the interface that routes to the
store's host (:func:`listen_address`), which every host of a cluster can reach back.
``PYCOMM_PORT_RANGE=lo-hi`` pins the TCP transport's listening ports.

Start-up: every rank publishes its host identity, each pair of ranks picks the first
transport in the preference list that can link them (``auto``: shm inside a host, tcp
across hosts), transports connect, and an init barrier runs over the new communicator.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import socket
from dataclasses import dataclass

import msgpack
import numpy as np

from transports import TransportError, get_transport_class, host_identity

from . import config, pmi, shmcoll, trace
from .errors import ArgumentError, CommError
from .buffers import IN_PLACE as pycomm_IN_PLACE
from .ops import MAX as _MAX
from .p2p import Engine, default_spin_seconds, default_yield_seconds
from .stall import Inspector
from .waiting import available_cores

__all__ = ["HostLayout", "JobEnv", "create_world", "detect", "host_layout", "listen_address"]


@dataclass
class JobEnv:
    """What the environment says about this job."""

    rank: int
    size: int
    master_addr: str | None
    master_port: int | None
    token: bytes
    job_id: str
    launcher: str
    host_store: bool = False        # this rank must host the rendezvous store
    local_rank: int | None = None   # as the launcher says (the world's host_layout is
    local_size: int | None = None   # measured, not taken from these)
    addr_from: str | None = None    # the variable master_addr was derived from, if derived
    # Hydra's PMI connection when the store's address (and, if token is b"", the job secret)
    # is to be read from rank 0 through PMI at start-up; host_name is what Hydra calls this
    # host (PMI_HOSTNAME), the first name rank 0 tries for its own address.
    pmi: pmi.Endpoint | pmi.Client | None = None     # a Client: already connected
    host_name: str | None = None


def _first_slurm_host(nodelist: str) -> str:
    """First hostname of a SLURM hostlist expression.

    E.g. 'gpu[03-07,9],cpu1' -> 'gpu03'; 'node[1-2]-ib' -> 'node1-ib';
    'rack[2-3]-n[01-04]' -> 'rack2-n01' (every bracket's first value, zero padding kept).
    """
    entry = re.split(r",(?![^\[]*\])", nodelist.strip())[0]      # commas outside brackets
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m.group(1))[0], entry)


def _slurm_tasks_on_node(spec: str, node: int) -> int | None:
    """Tasks on node ``node`` (0-based) from SLURM's '2(x3),1' form; None if unknown."""
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node] if 0 <= node < len(counts) else None


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _is_loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _check_store_host(je: JobEnv) -> None:
    """Rank 0 hosts the store at the address the other ranks derived: say so at once when
    that address is not this host's (the others would wait for a store nobody serves).

    Raises:
        ArgumentError: naming the address, this host and what to set.
    """
    if not (je.host_store and je.addr_from and je.master_addr) or \
            _is_loopback(je.master_addr):
        return              # an address the user gave (MASTER_ADDR) may be a proxy's
    try:
        ip = socket.getaddrinfo(je.master_addr, None, socket.AF_INET)[0][4][0]
        with socket.socket() as probe:
            probe.bind((ip, 0))
    except OSError as exc:
        raise ArgumentError(
            f"{je.launcher}: rank 0 hosts the rendezvous store at {je.master_addr}, the host "
            f"{je.addr_from} names, but that is not an address of this host "
            f"({socket.gethostname()}): {exc}; set MASTER_ADDR to rank 0's host") from None


def listen_address(master_addr: str | None, master_port: int | None = None) -> str:
    """Return the IPv4 address a rank listens on and publishes when PYCOMM_HOST is unset.

    Loopback when there is no store or it is on loopback (a single-host job); else the
    source address the kernel would use to reach ``master_addr`` (a UDP ``connect`` sends
    nothing; ``getsockname`` then tells the interface that routes there), so every host
    that can reach the store's host can reach this rank.

    Raises:
        CommError: ``master_addr`` does not resolve, or no interface routes to it.
    """
    if not master_addr or _is_loopback(master_addr):
        return "127.0.0.1"
    try:
        target = socket.getaddrinfo(master_addr, master_port or 9, socket.AF_INET,
                                    socket.SOCK_DGRAM)[0][4]
    except OSError as exc:
        raise CommError(f"the store's host {master_addr!r} does not resolve: {exc}; set "
                        "PYCOMM_MASTER_ADDR to its address") from exc
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(target)
        return probe.getsockname()[0]
    except OSError as exc:
        raise CommError(f"no interface of host {socket.gethostname()} routes to the store's "
                        f"host {master_addr} ({target[0]}): {exc}; set PYCOMM_HOST to this "
                        "host's address") from exc
    finally:
        probe.close()


_HNP_HOST = re.compile(r"tcp6?://\[?([0-9A-Za-z.:-]+?)\]?[,:]")


def _hnp_host(uri: str | None) -> str | None:
    """Open MPI's HNP URI ('123.0;tcp://10.0.0.5,172.17.0.1:4123') -> its first address."""
    match = _HNP_HOST.search(uri or "")
    return match.group(1) if match else None


def _derived_token(*parts: object) -> bytes:
    return hashlib.sha256("pycomm-derived:".encode() + repr(parts).encode()).digest()


def _pmi_or_raise(env: dict[str, str], kind: str, size: int,
                  local_size: int | None) -> pmi.Endpoint:
    """The PMI connection through which a multi-host mpiexec's ranks learn rank 0's store.

    Raises:
        ArgumentError: there is none (Open MPI, or no usable PMI_FD / PMI_PORT), saying why
            and what to set instead.
    """
    why = ""
    if kind == "Hydra":
        try:
            endpoint = pmi.endpoint_from_env(env)
        except ArgumentError as exc:
            endpoint, why = None, f"; pycomm reads it through PMI, but {exc}"
        if endpoint is not None:
            return endpoint
        why = why or "; pycomm reads it through PMI, but neither PMI_FD nor PMI_PORT is set"
    how = "-genv MASTER_ADDR node01 -genv MASTER_PORT 29500" if kind == "Hydra" \
        else "-x MASTER_ADDR=node01 -x MASTER_PORT=29500"
    raise ArgumentError(
        f"mpiexec ({kind}) started {size} ranks on more than one host ({local_size} on this "
        f"one) and its variables do not name the host of rank 0{why}: set MASTER_ADDR to "
        f"rank 0's host and MASTER_PORT to a free port on every rank, e.g. mpiexec {how} ...")


def detect(environ: dict[str, str] | None = None) -> JobEnv:
    """Read the launcher's variables; see the module docstring for the table.

    Reads only variables, except under ``mpiexec -pmi-port`` (``PMI_PORT`` and ``PMI_ID``,
    no ``PMI_RANK``): there it connects to the PMI proxy to learn rank and size, and the
    returned JobEnv holds that connection for :func:`create_world`.

    Raises:
        ArgumentError: variables are set but inconsistent (rank out of range, no port), or a
            multi-host mpiexec names no host of rank 0 and gives no PMI connection;
            CommError: the PMI connection of ``-pmi-port`` fails (CommTimeoutError: within
            ``PYCOMM_TIMEOUT`` seconds).
    """
    env = dict(os.environ if environ is None else environ)
    get = lambda name: config.get(name, env)  # noqa: E731
    over_addr, over_port = get("PYCOMM_MASTER_ADDR"), get("PYCOMM_MASTER_PORT")
    token_text = get("PYCOMM_JOB_TOKEN")

    def token_or(*parts) -> bytes:
        if token_text:
            try:
                return bytes.fromhex(token_text)
            except ValueError:
                return token_text.encode()
        return _derived_token(*parts)

    if get("PYCOMM_RANK") is not None:
        rank, size = get("PYCOMM_RANK"), get("PYCOMM_WORLD_SIZE")
        job = get("PYCOMM_JOB_ID") or "job"
        je = JobEnv(rank, size, over_addr or "127.0.0.1", over_port, token_or(job), job,
                    "pycomm")
    elif "RANK" in env and "WORLD_SIZE" in env:
        rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
        addr = over_addr or env.get("MASTER_ADDR", "127.0.0.1")
        port = over_port or (int(env["MASTER_PORT"]) + 1 if "MASTER_PORT" in env else None)
        job = env.get("TORCHELASTIC_RUN_ID", "torchrun")
        je = JobEnv(rank, size, addr, port, token_or(job, addr, port), f"t{port}", "torchrun",
                    host_store=rank == 0, local_rank=_int_or_none(env.get("LOCAL_RANK")),
                    local_size=_int_or_none(env.get("LOCAL_WORLD_SIZE")))
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, size = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        jobid = env.get("SLURM_JOB_ID", "0") + "." + env.get("SLURM_STEP_ID", "0")
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
        addr = over_addr or env.get("MASTER_ADDR") or _first_slurm_host(nodes)
        port = over_port or (int(env["MASTER_PORT"]) + 1 if "MASTER_PORT" in env else
                             20000 + int(hashlib.sha256(jobid.encode()).hexdigest(), 16)
                             % 20000)
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        node = _int_or_none(env.get("SLURM_NODEID")) or 0
        local_size = (_slurm_tasks_on_node(per_node, node) if per_node else
                      _int_or_none(env.get("SLURM_NTASKS_PER_NODE")))
        je = JobEnv(rank, size, addr, port, token_or(jobid), f"s{jobid}", "slurm",
                    host_store=rank == 0, local_rank=_int_or_none(env.get("SLURM_LOCALID")),
                    local_size=local_size, addr_from=None if over_addr or env.get(
                        "MASTER_ADDR") else "SLURM_STEP_NODELIST's first host")
    elif "PMI_RANK" in env or "OMPI_COMM_WORLD_RANK" in env:
        if "PMI_RANK" in env:
            rank, size = int(env["PMI_RANK"]), int(env.get("PMI_SIZE", "1"))
            local = (_int_or_none(env.get("MPI_LOCALRANKID")),
                     _int_or_none(env.get("MPI_LOCALNRANKS")))
        else:
            rank = int(env["OMPI_COMM_WORLD_RANK"])
            size = int(env.get("OMPI_COMM_WORLD_SIZE", "1"))
            local = (_int_or_none(env.get("OMPI_COMM_WORLD_LOCAL_RANK")),
                     _int_or_none(env.get("OMPI_COMM_WORLD_LOCAL_SIZE")))
        hnp = env.get("OMPI_MCA_orte_hnp_uri")
        # The ranks' local size says whether the job spans hosts; unknown counts as one host.
        many_hosts = local[1] is not None and local[1] < size
        # A port anchor every rank of the job shares: Open MPI's HNP URI (<= 4) or PMIx
        # namespace (5); on one host, the launcher's proxy, every rank's parent.
        anchor = hnp or env.get("PMIX_NAMESPACE") or (
            None if many_hosts else (env.get("PMI_PORT") or str(os.getppid())))
        addr = over_addr or env.get("MASTER_ADDR") or _hnp_host(hnp)
        port = over_port or (int(env["MASTER_PORT"]) + 1 if "MASTER_PORT" in env else None)
        endpoint = None
        if many_hosts and (addr is None or (port is None and anchor is None)):
            endpoint = _pmi_or_raise(env, "Hydra" if "PMI_RANK" in env else "Open MPI", size,
                                     local[1])
        if endpoint is not None:
            # The store's address, port and (unless given) secret come from rank 0 through
            # PMI at start-up (:func:`_pmi_rendezvous`); so does the job id.
            je = JobEnv(rank, size, addr, port, token_or() if token_text else b"", "m",
                        "mpiexec", host_store=rank == 0, local_rank=local[0],
                        local_size=local[1], pmi=endpoint, host_name=env.get("PMI_HOSTNAME"))
        else:
            addr = addr or "127.0.0.1"
            if port is None:
                port = 20000 + int(hashlib.sha256(anchor.encode()).hexdigest(), 16) % 20000
            je = JobEnv(rank, size, addr, port, token_or(anchor or f"{addr}:{port}"),
                        f"m{port}", "mpiexec", host_store=rank == 0, local_rank=local[0],
                        local_size=local[1],
                        addr_from=None if over_addr or env.get("MASTER_ADDR") or not hnp
                        else "OMPI_MCA_orte_hnp_uri")
    elif "PMI_PORT" in env and "PMI_ID" in env:
        # mpiexec -pmi-port: no PMI_RANK; the proxy tells rank and size on connection, and
        # the store is always found through PMI (no variable is shared by every rank).
        client = pmi.Client(pmi.endpoint_from_env(env), float(get("PYCOMM_TIMEOUT")))
        if client.size == 1:
            client.close()
            return JobEnv(0, 1, None, None, b"", f"solo{os.getpid()}", "mpiexec")
        je = JobEnv(client.rank, client.size, over_addr or env.get("MASTER_ADDR"),
                    over_port or (int(env["MASTER_PORT"]) + 1 if "MASTER_PORT" in env
                                  else None),
                    token_or() if token_text else b"", "m", "mpiexec",
                    host_store=client.rank == 0,
                    local_rank=_int_or_none(env.get("MPI_LOCALRANKID")),
                    local_size=_int_or_none(env.get("MPI_LOCALNRANKS")), pmi=client,
                    host_name=env.get("PMI_HOSTNAME"))
    else:
        return JobEnv(0, 1, None, None, b"", f"solo{os.getpid()}", "none")
    if not 0 <= je.rank < je.size:
        raise ArgumentError(f"{je.launcher} says rank {je.rank} of {je.size}: out of range")
    if je.size > 1 and je.master_port is None and je.pmi is None:
        raise ArgumentError(f"{je.launcher} launch without a store port: set MASTER_PORT or "
                            "PYCOMM_MASTER_PORT")
    return je


_INSPECTOR_CONNECT_S = 3.0  # seconds the stall inspector's store clients take to connect
_PMI_KEY = "pycomm-store"   # rank 0's "address,port,secret hex" (or "error,host,why") in PMI


def _own_address(je: JobEnv) -> str:
    """An IPv4 address of this host (rank 0's) for the other hosts to reach its store.

    ``MASTER_ADDR`` or ``PYCOMM_HOST`` when set; else what the name Hydra knows this host by
    (``PMI_HOSTNAME``), then this host's name, resolves to, the first non-loopback address
    this host can bind (the names by which the launcher reached the hosts are the ones the
    hosts resolve; MPICH's TCP netmod takes its address from the hostname alike).

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
    raise ArgumentError(
        f"mpiexec (Hydra): rank 0 (host {socket.gethostname()}) found no address of its own "
        f"for the other hosts to reach its store: {'; '.join(tried) or 'no name to resolve'}; "
        "set PYCOMM_HOST to rank 0's address, or MASTER_ADDR to rank 0's host on every rank "
        "(mpiexec -genv MASTER_ADDR node01 ...)")


def _pmi_rendezvous(je: JobEnv, timeout: float):
    """Learn the store's address, port and secret from rank 0 through Hydra's PMI.

    Rank 0 starts the store (on ``MASTER_PORT + 1`` if given, else a free port), publishes
    ``address,port,secret`` under :data:`_PMI_KEY`, or ``error,host,reason`` if it cannot;
    every rank then passes a PMI barrier and reads it, so a failing rank 0 stops every rank
    at once with its reason. The PMI connection is finalized and closed before returning.

    Args:
        je: a JobEnv with ``pmi`` set (from :func:`detect`).
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
    client = je.pmi if isinstance(je.pmi, pmi.Client) else pmi.Client(je.pmi, timeout)
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


def _choose_transports(name: str, rank: int, infos: list[dict]) -> dict[str, list[int]]:
    """Map transport name -> peers it serves, by the preference list for ``name``."""
    prefs = ["shm", "tcp"] if name == "auto" else [name]
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
        job: who this rank is and where the store is; default :func:`detect` (the
            environment). :mod:`pycomm.ray` passes its own.
        transport: "auto" (default, or ``PYCOMM_TRANSPORT``), "shm", "tcp" or "rdma".
        timeout: seconds for start-up and the default for every wait (``PYCOMM_TIMEOUT``).
        eager_limit: bytes (``PYCOMM_EAGER_LIMIT``).

    Returns:
        (communicator, closer): the world communicator and a function releasing it all.

    Raises:
        ArgumentError: an unknown option or transport; CommError: a peer unreachable.
    """
    from .comm import Communicator

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
    server = store = inspector = None
    try:
        if je.pmi is not None:
            je, server = _pmi_rendezvous(je, timeout)
        if je.size > 1:
            from .store import StoreClient, StoreServer
            if je.host_store and server is None:
                server = StoreServer(je.token, host="0.0.0.0" if je.master_addr not in (
                    "127.0.0.1", "localhost") else "127.0.0.1", port=je.master_port)
            store = StoreClient(je.master_addr, je.master_port, je.token, timeout=timeout)
            listen = (options.get("host") or config.get("PYCOMM_HOST")
                      or listen_address(je.master_addr, je.master_port))
            info = {"host": host_identity(), "hostname": socket.gethostname(),
                    "pid": os.getpid()}
            store.set(f"info/{je.job_id}/{je.rank}", msgpack.packb(info))
            infos = [msgpack.unpackb(store.get(f"info/{je.job_id}/{r}", timeout=timeout))
                     for r in range(je.size)]
            for tname, peers in sorted(_choose_transports(transport, je.rank, infos).items(),
                                       key=lambda kv: ("shm", "tcp", "rdma").index(kv[0])):
                opts = {}
                if tname == "shm":
                    opts = {"ring_bytes": int(options.get("ring_bytes") or
                                              config.get("PYCOMM_SHM_RING_BYTES")),
                            "cma": config.get("PYCOMM_CMA"),
                            "coll_bytes": shmcoll.area_bytes(
                                config.get("PYCOMM_SHM_COLL_BYTES"))}
                elif tname == "tcp":
                    opts = {"host": listen, "port_range": port_range,
                            "peer_timeout": config.get("PYCOMM_PEER_TIMEOUT")}
                elif tname == "rdma":
                    opts = {"host": listen, "cma": config.get("PYCOMM_CMA")}
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
            # means its host is gone (under torchrun rank 0 hosts it), and the inspector's
            # report of an error must not hold the failing rank for the whole timeout.
            reach = min(timeout, _INSPECTOR_CONNECT_S)
            engine._inspector = inspector = Inspector(
                je.rank, je.size, je.job_id,
                lambda: StoreClient(addr, port, token, timeout=reach),
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
        from .nbc import shutdown
        shutdown(engine)
        if inspector is not None:
            inspector.close()
        engine.close()
        if store is not None:
            store.close()
        if server is not None:
            server.close()

    return world, close
