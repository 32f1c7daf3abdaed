"""A throwaway SLURM cluster on emulated hosts: munged, slurmctld and one slurmd per host.

:class:`Slurm` takes a :class:`~benchmarks.cluster.netns.Cluster` of N hosts and starts, in
a private directory: ``munged`` (its own key and socket, so no system munge is needed or
touched), ``slurmctld`` on host 1 and ``slurmd -N host<K>`` on every host K, all from one
minimal ``slurm.conf`` (``select/cons_tres``, ``proctrack/linuxproc``, ``task/none``, no
accounting; every node configured with ``cpus`` CPUs whatever the hardware has), and waits
until every node is idle. ``srun`` run on a host with :meth:`Slurm.env` then starts real
job steps: slurmctld allocates, each host's slurmd starts a ``slurmstepd`` that starts the
tasks with SLURM's variables (SLURM_PROCID, SLURM_STEP_NODELIST='host[1-2]', ...). The
hosts resolve each other's names through the cluster's /etc/hosts, as SLURM needs.

    with Cluster(2, prefix="psl") as c, Slurm(c) as s:
        p = c.popen(1, ["srun", "-N", "2", "--ntasks-per-node", "2", "hostname"],
                    env=s.env(), stdout=subprocess.PIPE, text=True)

Everything it starts carries ``PYCOMM_SLURM_HARNESS=<its directory>`` in its environment
(slurmstepd inherits it from slurmd, the tasks from srun's environment), and :meth:`close`
kills every process that carries it, even in no namespace of the cluster, then removes the
directory. Debian: ``apt-get install slurm-wlm munge`` (slurmctld, slurmd, srun, munged);
root is needed (the daemons run as root, the hosts are network namespaces).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from .jobcheck import processes_with_env
from .netns import Cluster, Harness

__all__ = ["Slurm", "SlurmError", "find_tools"]

MARK = "PYCOMM_SLURM_HARNESS"
_TOOLS = ("munged", "slurmctld", "slurmd", "slurmstepd", "srun", "sinfo")


class SlurmError(RuntimeError):
    """SLURM is not installed, or its daemons did not come up (with their logs' tails)."""


def find_tools() -> dict[str, str]:
    """Absolute paths of the SLURM and munge programs (PATH, then /usr/sbin, /usr/bin).

    Raises:
        SlurmError: naming the missing ones and the Debian packages that have them.
    """
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
    found = {t: shutil.which(t, path=path) for t in _TOOLS}
    missing = [t for t, p in found.items() if p is None]
    if missing:
        raise SlurmError(f"no {', '.join(missing)} installed (Debian: apt-get install "
                         "slurm-wlm munge)")
    return found  # type: ignore[return-value]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _marked_pids(mark: str) -> list[int]:
    """Processes whose environment holds ``MARK=mark`` (not this one)."""
    return processes_with_env(f"{MARK}={mark}")


class Slurm(Harness):
    """A SLURM controller and daemons on the hosts of ``cluster``; a context manager.

    Args:
        cluster: the emulated hosts (entered); slurmctld runs on host 1.
        cpus: CPUs configured per node (SLURM then allows that many tasks on it).
        timeout: seconds to wait for every node to be idle.
    """

    def __init__(self, cluster: Cluster, cpus: int = 4, timeout: float = 30):
        self.cluster, self.cpus, self.timeout = cluster, cpus, timeout
        self.tools = find_tools()
        self.dir: str | None = None
        self._daemons: list[subprocess.Popen] = []

    @property
    def nodes(self) -> list[str]:
        return [self.cluster.hostname(k) for k in range(1, self.cluster.n + 1)]

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default os.environ) without SLURM_* variables, with this cluster's
        SLURM_CONF and the harness's mark (which :meth:`close` kills by)."""
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if not k.startswith("SLURM_")}
        env.update({"SLURM_CONF": f"{self.dir}/slurm.conf", MARK: self.dir})
        return env

    # -- life cycle -------------------------------------------------------------------------
    def __enter__(self) -> Slurm:
        self.dir = tempfile.mkdtemp(prefix="pycomm-slurm-")
        return super().__enter__()

    def _conf(self) -> str:
        d, c = self.dir, self.cluster
        n = c.n
        nodes = "host1" if n == 1 else f"host[1-{n}]"
        return f"""# written by benchmarks/cluster/slurm.py
ClusterName=pycomm
SlurmctldHost={c.hostname(1)}({c.addr(1)})
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
InactiveLimit=0
KillWait=2
MinJobAge=2
NodeName={nodes} CPUs={self.cpus} State=UNKNOWN
PartitionName=pycomm Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

    def _start(self) -> None:
        d, c, tools = self.dir, self.cluster, self.tools
        os.chmod(d, 0o711)                     # munged wants its socket's directory searchable
        os.mkdir(f"{d}/state")
        with open(f"{d}/munge.key", "wb") as fh:
            fh.write(os.urandom(1024))
        os.chmod(f"{d}/munge.key", 0o400)
        with open(f"{d}/slurm.conf", "w") as fh:
            fh.write(self._conf())
        for k in range(1, c.n + 1):
            os.mkdir(f"{d}/spool-{c.hostname(k)}")
            # `ip netns exec` gave the host a fresh /sys, with nothing on /sys/fs/cgroup; a
            # tmpfs there with the name=systemd hierarchy under it is what slurmd's cgroup
            # autodetection takes for cgroup v1 (with proctrack/linuxproc and task/none it
            # makes no cgroup, but will not start without one). The mounts are in the
            # host's private mount namespace only.
            done = c.run(k, ["sh", "-c", "mount -t tmpfs -o size=1m cgroup /sys/fs/cgroup "
                             "&& mkdir /sys/fs/cgroup/systemd && mount -t cgroup -o "
                             "none,name=systemd cgroup /sys/fs/cgroup/systemd"])
            if done.returncode != 0:
                raise SlurmError(f"host {k}: cannot mount a tmpfs on /sys/fs/cgroup: "
                                 f"{done.stderr.strip()}")
        env = self.env()

        def start(argv, log, k=None):
            with open(f"{d}/{log}", "wb") as out:
                if k is None:
                    p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         cwd=d)
                else:
                    p = c.popen(k, argv, cwd=d, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
            self._daemons.append(p)
        start([tools["munged"], "-F", "-f", f"--socket={d}/munge.sock",
               f"--key-file={d}/munge.key", f"--pid-file={d}/munged.pid",
               f"--seed-file={d}/munged.seed", "--log-file=/dev/null"], "munged.out")
        self._wait(lambda: os.path.exists(f"{d}/munge.sock"), "munged made no socket")
        start([tools["slurmctld"], "-D", "-f", f"{d}/slurm.conf"], "slurmctld.out", 1)
        for k in range(1, c.n + 1):
            start([tools["slurmd"], "-D", "-N", c.hostname(k), "-f", f"{d}/slurm.conf"],
                  f"slurmd-{k}.out", k)

        def idle() -> bool:
            out = c.run(1, [tools["sinfo"], "-h", "-N", "-o", "%N %T"], env=env,
                        timeout=10).stdout.split()
            states = dict(zip(out[::2], out[1::2]))
            return all(states.get(n) == "idle" for n in self.nodes)
        self._wait(idle, "the nodes did not become idle")

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not ready():
            dead = [p for p in self._daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{what} within {self.timeout:g} s" if not dead else \
                    f"{dead[0].args[-4:]} exited with {dead[0].returncode}"
                raise SlurmError(f"SLURM did not start: {why}\n{self.logs()}")
            time.sleep(0.2)

    def logs(self, lines: int = 15) -> str:
        """The last lines of every daemon's log, for failure messages."""
        if not self.dir or not os.path.isdir(self.dir):
            return ""
        out = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith((".log", ".out")):
                with open(f"{self.dir}/{name}", errors="replace") as fh:
                    out.append(f"--- {name}\n" + "".join(fh.readlines()[-lines:]))
        return "\n".join(out)

    def leftovers(self, wait: float = 5) -> list[int]:
        """Processes of job steps (slurmstepd, tasks, srun) still alive after up to ``wait``
        seconds: every marked process but the daemons and their own children."""
        daemons = {p.pid for p in self._daemons}
        deadline = time.monotonic() + wait
        while True:
            left = [pid for pid in _marked_pids(self.dir) if pid not in daemons
                    and _parent(pid) not in daemons]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)

    def close(self) -> None:
        """Kill the job steps, then the daemons, then anything else carrying the mark;
        remove the directory."""
        if self.dir is None:
            return
        daemons = {p.pid for p in self._daemons}
        # job steps and tasks first: a slurmstepd outlives a killed slurmd (the daemons'
        # own children, slurmctld's slurmscriptd, go with them)
        for pid in _marked_pids(self.dir):
            if pid not in daemons and _parent(pid) not in daemons:
                _kill(pid, signal.SIGKILL)
        for p in reversed(self._daemons):       # slurmd, slurmctld, munged
            if p.poll() is None:
                p.terminate()
        for p in self._daemons:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        deadline = time.monotonic() + 5
        while (left := _marked_pids(self.dir)) and time.monotonic() < deadline:
            for pid in left:
                _kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None
        self._daemons = []


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
