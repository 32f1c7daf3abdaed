"""A throwaway Ray cluster on emulated hosts: a head node on host 1, a worker node on every
other host.

:class:`RayNodes` takes a :class:`~benchmarks.cluster.netns.Cluster` of N hosts and runs
``ray start`` on every host K (``--head --port 6379`` on host 1, ``--address
<host 1>:6379`` on the others) with ``--node-ip-address`` the host's bridge address, a
custom resource ``host<K>`` (so a driver can place actors per host), few CPUs, a small
object store, no dashboard and no usage report, then waits until every node is alive in
the cluster. A driver run on a host (:meth:`RayNodes.driver`) joins it with
``ray.init(address=<host 1>:6379)``.

Each node runs in its own PID namespace (``unshare --pid --fork --kill-child
--mount-proc``) inside its host, whose first process is a small reaper that runs ``ray
start`` and adopts the daemons it leaves: Ray's daemons and workers live in that namespace
and nothing else does. So :meth:`RayNodes.stop` runs ``ray stop`` inside the namespace,
where it sees (and stops) that node's processes only, never another Ray on this machine
(``ray stop`` stops every Ray process it can see); :meth:`RayNodes.processes` lists what
is left there; and when the namespace's first process dies, the kernel kills every process
left in it. Each node has its own ``--temp-dir`` (the hosts share this machine's /tmp);
the hosts' /dev/shm are the cluster's private ones, which Ray's object store and pycomm's
shared memory use. The nodes and drivers authenticate with a fresh token (Ray's token
authentication; :meth:`RayNodes.env`).

    with Cluster(2, prefix="pry") as c, RayNodes(c) as r:
        p = r.driver(["python", "my_driver.py", r.address])

:meth:`close` stops every node (``ray stop``, then kills what is left of its namespace)
and removes the temporary directories. Root is needed (namespaces).
"""

from __future__ import annotations

import importlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from .netns import Cluster, Harness

__all__ = ["RayError", "RayNodes", "find_ray"]

PORT = 6379
_ARGV = "PYCOMM_RAY_NODE_ARGV"
# The first process of a node's PID namespace: runs `ray start` (its argv in the
# environment, so that no word of it is in this process's command line, which `ray stop`
# matches against), exits if that fails (ending the namespace), and reaps the daemons it
# leaves, orphaned in the namespace, until it is killed.
_INIT = f"""
import json, os, subprocess, sys, time
start = subprocess.Popen(json.loads(os.environ.pop({_ARGV!r})))
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        time.sleep(0.2)
        continue
    if pid == start.pid and os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"ray start failed ({{os.waitstatus_to_exitcode(status)}})")
"""


# A driver on host 1 that reports how many nodes are alive: joins once, then prints
# "ALIVE n" whenever the count changes until it reaches the wanted one (exits with an
# error while the head does not answer yet; RayNodes starts another).
_WATCH = """
import sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
seen = -1
while seen < int(sys.argv[2]):
    alive = sum(n["Alive"] for n in ray.nodes())
    if alive != seen:
        print("ALIVE", alive, flush=True)
        seen = alive
    time.sleep(0.1)
"""


class _Watch:
    """A running _WATCH and the last count it printed (read by a thread)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.alive, self.ended = proc, 0, threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("ALIVE "):
                self.alive = int(line.split()[1])
        self.ended.set()


class RayError(RuntimeError):
    """Ray is not installed, or its nodes did not come up (with their logs' tails)."""


def find_ray() -> str:
    """The ``ray`` command of this Python's Ray (next to ``sys.executable``, then PATH).

    Raises:
        RayError: this Python cannot import ray, or has no ``ray`` command.
    """
    try:
        importlib.import_module("ray")
    except ImportError as exc:
        raise RayError(f"ray is not installed for {sys.executable} ({exc})") from None
    here = os.path.join(os.path.dirname(sys.executable), "ray")
    found = here if os.access(here, os.X_OK) else shutil.which("ray")
    if found is None:
        raise RayError(f"no 'ray' command next to {sys.executable} or on PATH")
    return found


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []


class RayNodes(Harness):
    """A Ray node on every host of ``cluster``; a context manager.

    Args:
        cluster: the emulated hosts (entered); the head runs on host 1.
        cpus: CPUs each node offers (``--num-cpus``).
        object_store_mb: each node's object store, in MiB.
        timeout: seconds to wait for every node to be alive.
        env: environment of the nodes (Ray's workers inherit it: PYTHONPATH, PYCOMM_*)
            and default of the drivers (default os.environ).
    """

    def __init__(self, cluster: Cluster, cpus: int = 2, object_store_mb: int = 80,
                 timeout: float = 60, env: dict[str, str] | None = None):
        self.cluster, self.cpus, self.timeout = cluster, cpus, timeout
        self.base_env = dict(os.environ if env is None else env)
        self.object_store_mb = object_store_mb
        self.ray = find_ray()
        self.dir: str | None = None
        self._nodes: dict[int, subprocess.Popen] = {}
        self._init: dict[int, int] = {}     # host -> PID of its namespace's first process
        self._stopped: set[int] = set()     # hosts whose node `ray stop` ended
        self._watch: _Watch | None = None
        self.token = secrets.token_hex(32)

    @property
    def address(self) -> str:
        """The head's GCS address, for ``ray.init(address=...)``."""
        return f"{self.cluster.addr(1)}:{PORT}"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default the nodes' environment) without RAY_ADDRESS, with this
        cluster's token (Ray's token authentication, the token in the environment, not
        ~/.ray/auth_token, which may hold another cluster's) and no usage report."""
        env = {k: v for k, v in (self.base_env if base is None else base).items()
               if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
        env.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN": self.token})
        return env

    def temp_dir(self, k: int) -> str:
        return f"{self.dir}/h{k}"

    # -- life cycle -------------------------------------------------------------------------
    def __enter__(self) -> RayNodes:
        # Short: Ray puts Unix sockets under it (107 characters at most).
        self.dir = tempfile.mkdtemp(prefix="pcray-", dir="/tmp")
        return super().__enter__()

    def _argv(self, k: int) -> list[str]:
        c = self.cluster
        argv = [self.ray, "start", "--node-ip-address", c.addr(k),
                "--num-cpus", str(self.cpus), "--num-gpus", "0",
                "--object-store-memory", str(self.object_store_mb * 2**20),
                "--resources", json.dumps({c.hostname(k): self.cpus}),
                "--temp-dir", self.temp_dir(k), "--disable-usage-stats"]
        if k == 1:
            argv += ["--head", "--port", str(PORT), "--include-dashboard", "false"]
        else:
            argv += ["--address", self.address]
        return argv

    def _start(self) -> None:
        c = self.cluster
        for k in range(1, c.n + 1):
            os.mkdir(self.temp_dir(k))
            env = {**self.env(), _ARGV: json.dumps(self._argv(k))}
            with open(f"{self.dir}/node-{k}.out", "wb") as out:
                self._nodes[k] = c.popen(
                    k, ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                        sys.executable, "-c", _INIT], cwd=self.dir, env=env, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True)
            # unshare (the Popen) forks the namespace's first process, _INIT
            deadline = time.monotonic() + 10
            while not (kids := _children(self._nodes[k].pid)):
                if self._nodes[k].poll() is not None or time.monotonic() > deadline:
                    raise RayError(f"host {k}: ray start did not start\n{self.logs()}")
                time.sleep(0.05)
            self._init[k] = kids[0]
            if k == 1:
                self._wait(lambda: self._alive_nodes() >= 1, "the head did not come up")
        self._wait(lambda: self._alive_nodes() >= c.n, f"{c.n} nodes did not come up")
        if self._watch is not None:
            try:
                self._watch.proc.wait(timeout=30)       # it leaves once all are alive
            except subprocess.TimeoutExpired:
                self._watch.proc.kill()
            self._watch = None

    def _alive_nodes(self) -> int:
        """How many nodes the head lists as alive (0 while it does not answer), as one
        watching driver on host 1 last said (a driver's start-up costs seconds: one joins
        and polls, instead of one joining per question); another is started while the
        head does not answer."""
        w = self._watch
        if w is None or (w.ended.is_set() and w.alive < self.cluster.n):
            if w is not None:
                w.proc.wait()
            self._watch = w = _Watch(self.cluster.popen(
                1, [sys.executable, "-c", _WATCH, self.address, str(self.cluster.n)],
                env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True))
        return w.alive

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            dead = [k for k, p in self._nodes.items() if p.poll() is not None]
            if dead:
                raise RayError(f"Ray did not start: host {dead[0]}'s ray start exited with "
                               f"{self._nodes[dead[0]].returncode}\n{self.logs()}")
            if ready():
                return
            if time.monotonic() > deadline:
                raise RayError(f"Ray did not start: {what} within {self.timeout:g} s\n"
                               f"{self.logs()}")
            time.sleep(0.1)

    def nsenter(self, k: int, argv: list[str]) -> list[str]:
        """The argv that runs ``argv`` inside host ``k``'s Ray node namespace (its PID and
        mount namespaces, the host's network and hostname)."""
        return ["nsenter", "-t", str(self._init[k]), "--pid", "--mount", "--uts", "--net",
                f"--wd={self.dir}", "--", *argv]

    def driver(self, argv: list[str], k: int = 1, **kwargs) -> subprocess.Popen:
        """Start ``argv`` on host ``k`` inside its node's namespaces (a Ray driver on that
        node); it is killed when the cluster closes."""
        p = subprocess.Popen(self.nsenter(k, argv), env=self.env(kwargs.pop("env", None)),
                             **kwargs)
        self.cluster._procs.append(p)
        return p

    def processes(self, k: int) -> list[str]:
        """``PID command`` of every process in host ``k``'s node namespace but its first
        (the reaper) and this query."""
        if k not in self._init or self._nodes[k].poll() is not None:
            return []
        done = subprocess.run(self.nsenter(k, ["ps", "-e", "-o", "pid=,args="]),
                              capture_output=True, text=True, timeout=30)
        rows = [line.strip().split(None, 1) for line in done.stdout.splitlines()]
        return [" ".join(r) for r in rows if len(r) == 2 and r[0] != "1"
                and not r[1].startswith("ps -e -o")]

    def stop(self, k: int) -> subprocess.CompletedProcess:
        """``ray stop`` inside host ``k``'s node namespace (that node's processes only)."""
        done = subprocess.run(self.nsenter(k, [self.ray, "stop", "--grace-period", "6"]),
                              capture_output=True, text=True, timeout=60, env=self.env())
        if done.returncode == 0:
            self._stopped.add(k)
        return done

    def logs(self, lines: int = 15) -> str:
        """The last lines of each node's ``ray start`` output and raylet log."""
        if not self.dir or not os.path.isdir(self.dir):
            return ""
        out = []
        for k in sorted(self._nodes):
            paths = [f"{self.dir}/node-{k}.out"] + sorted(
                os.path.join(root, f) for root, _, files in os.walk(self.temp_dir(k))
                for f in files if f in ("raylet.err", "raylet.out", "gcs_server.err"))
            for path in paths:
                try:
                    with open(path, errors="replace") as fh:
                        out.append(f"--- host {k}: {os.path.relpath(path, self.dir)}\n"
                                   + "".join(fh.readlines()[-lines:]))
                except OSError:
                    pass
        return "\n".join(out)

    def close(self) -> None:
        """Stop every node: ``ray stop`` in its namespace (unless :meth:`stop` did), then
        kill its first process (the kernel kills what is left in the namespace); remove the
        directory."""
        if self._watch is not None:         # a start that failed while it watched
            self._watch.proc.kill()
            self._watch.proc.wait()
            self._watch = None
        for k in sorted(self._nodes, reverse=True):
            p = self._nodes[k]
            if p.poll() is None and k in self._init and k not in self._stopped:
                try:
                    self.stop(k)
                except (OSError, subprocess.SubprocessError):
                    pass
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                for pid in (self._init.get(k), p.pid):
                    try:
                        if pid:
                            os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        self._nodes, self._init, self._stopped = {}, {}, set()
