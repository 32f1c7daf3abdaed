"""Which launcher started this process, and what its variables say: :func:`detect`.

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
                                                          PMI_PORT; :mod:`pycomm.launch.pmi`)
mpiexec, Open   OMPI_COMM_WORLD_RANK / _SIZE              MASTER_ADDR, else mpirun's host
MPI             (OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_     from OMPI_MCA_orte_hnp_uri (<= 4);
                SIZE)                                     port from MASTER_PORT + 1, the
                                                          HNP URI or PMIX_NAMESPACE (5);
                                                          5, more hosts, no MASTER_ADDR:
                                                          rank 0 publishes its address and
                                                          port through PMIx
                                                          (:mod:`pycomm.launch.pmix`)
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
that is loopback or not rank 0's, every rank stops with that reason and what to set.
A multi-host Open MPI 5 job (``PMIX_NAMESPACE`` set, no HNP URI) with no ``MASTER_ADDR``
does the same through PMIx, as Open MPI's own ranks exchange their addresses: put,
commit, a fence that collects the data, get (:mod:`pycomm.launch.pmix`; the host name
tried first is ``PMIX_HOSTNAME``, the space's name is the PMIx namespace). A multi-host
mpiexec that gives neither a PMI(x) connection nor ``MASTER_ADDR`` (or whose PMIx library
is not found) is a clear error naming what to set.

``PYCOMM_MASTER_ADDR`` / ``PYCOMM_MASTER_PORT`` override the derived address for every
launcher. Under an external launcher rank 0 hosts the store in a background thread. The
job secret is ``PYCOMM_JOB_TOKEN``; under an external launcher that does not set it a
token is derived from the job's identifiers, which keeps strangers of other jobs out but is
not secret: export PYCOMM_JOB_TOKEN (same value on every rank) for real authentication.
Where the store is found through PMI, rank 0 draws a random secret and shares it there
instead (as private as the job's own PMI traffic).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import socket
from dataclasses import dataclass

from .. import config
from ..errors import ArgumentError, CommError
from . import pmi, pmix

__all__ = ["JobEnv", "detect", "listen_address"]


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
    # Hydra's PMI connection (Open MPI 5's PMIx one) when the store's address (and, if token
    # is b"", the job secret) is to be read from rank 0 through PMI at start-up; host_name is
    # what the launcher calls this host (PMI_HOSTNAME, PMIX_HOSTNAME), the first name rank 0
    # tries for its own address.
    pmi: pmi.Endpoint | pmi.Client | pmix.Endpoint | pmix.Client | None = None  # Client: open
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
                  local_size: int | None) -> pmi.Endpoint | pmix.Endpoint:
    """The PMI connection through which a multi-host mpiexec's ranks learn rank 0's store:
    Hydra's PMI-1 one, or Open MPI 5's PMIx one (``PMIX_NAMESPACE`` and a libpmix found).

    Raises:
        ArgumentError: there is none (Open MPI <= 4, no usable PMI_FD / PMI_PORT, no PMIx
            library), saying why and what to set instead.
    """
    why = ""
    if kind == "Open MPI" and env.get("PMIX_NAMESPACE"):
        kind = "Open MPI 5"
        try:
            return pmix.endpoint_from_env(env)
        except ArgumentError as exc:
            why = f"; pycomm reads it through PMIx, but {exc}"
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
                        local_size=local[1], pmi=endpoint, host_name=env.get(
                            "PMI_HOSTNAME" if "PMI_RANK" in env else "PMIX_HOSTNAME"))
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
