"""Emulated cluster: N hosts as Linux network namespaces joined by a bridge.

Each host ``K`` (1-based) is a network namespace ``<prefix>-h<K>`` whose ``eth0`` is one end
of a veth pair; the other end is a port of the bridge ``<prefix>-br``. Host K has address
``<subnet>.K/24`` (default 10.77.0.K); that range exists only inside these namespaces (the
initial namespace has no address on the bridge), so nothing here can reach a real network.
Each host also has one holder process, started as ``ip netns exec NS unshare --uts --mount
sh -c 'hostname host<K>; mount -t tmpfs tmpfs /dev/shm; exec sleep ...'``, that keeps the
host's UTS and mount namespaces alive; a command runs in the host through ``nsenter`` into
the holder's network, UTS and mount namespaces. So every process of host K sees hostname
``host<K>`` and, with ``private_shm``, the same private tmpfs on /dev/shm (its ranks share
memory, ranks of other hosts cannot): pycomm sees K hosts and uses shm inside a host and
TCP between hosts. With ``private_shm`` the hosts also resolve each other's names: an
/etc/hosts listing ``host<K> <address>`` is bind-mounted in each host's mount namespace
(as cluster nodes resolve each other; SLURM's nodelist names hosts, not addresses).
With ``rate`` (e.g. "2gbit") every host's eth0 egress goes through ``tc qdisc tbf``.
:meth:`Cluster.ssh_stand_in` writes an ``ssh`` stand-in that runs a command on the host it
names, so launchers that reach hosts by ssh (MPICH's Hydra: ``mpiexec -launcher ssh
-launcher-exec PATH``) start their proxies in the emulated hosts.

    with Cluster(2, rate="2gbit") as c:
        p = c.popen(1, ["python", "-c", "import socket; print(socket.gethostname())"])

Everything created is removed on exit, even after an error; ``cleanup(prefix)`` (or
``python -m benchmarks.cluster.netns --cleanup``) removes leftovers of a killed run by name.

Requires root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2's ``ip`` and ``tc``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence

__all__ = ["Cluster", "ClusterError", "Harness", "check_support", "cleanup"]

PREFIX = "pcx"


class ClusterError(RuntimeError):
    """The emulated cluster cannot be built here (not root, no iproute2, a command failed)."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise ClusterError(f"{shlex.join(argv)} failed ({proc.returncode}): "
                           f"{proc.stderr.strip()}")
    return proc


def check_support() -> None:
    """Raise ClusterError saying what is missing when namespaces cannot be made here."""
    missing = [tool for tool in ("ip", "tc", "unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        raise ClusterError(f"the emulated cluster needs {', '.join(missing)} (iproute2, "
                           "util-linux) on PATH")
    if os.geteuid() != 0:
        raise ClusterError(f"the emulated cluster needs root to create network namespaces "
                           f"(running as uid {os.geteuid()})")


def cleanup(prefix: str = PREFIX) -> list[str]:
    """Delete every namespace and link whose name starts with ``prefix``; return their names."""
    gone = []
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(prefix + "-"):
            _run("ip", "netns", "del", name, check=False)
            gone.append(name)
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(prefix + "-"):
                _run("ip", "link", "del", name, check=False)
                gone.append(name)
    return gone


class Harness:
    """A context manager that starts something on entry (:meth:`_start`) and stops it on
    exit (:meth:`close`, which must also undo a start that failed half way)."""

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Cluster(Harness):
    """N emulated hosts; a context manager that builds them on entry and removes them on exit.

    Args:
        n: number of hosts (1..250).
        prefix: start of every name created (namespaces, bridge, veths): at most 8 chars,
            so that ``<prefix>-h<K>b`` fits Linux's 15-character interface names.
        subnet: first three octets of the hosts' /24 (host K is ``<subnet>.K``).
        rate: optional tc rate for each host's egress ("2gbit"); None leaves links unshaped.
        private_shm: give each host its own tmpfs on /dev/shm.
    """

    def __init__(self, n: int, *, prefix: str = PREFIX, subnet: str = "10.77.0",
                 rate: str | None = None, private_shm: bool = True):
        if not 1 <= n <= 250:
            raise ValueError(f"n={n}: a cluster has 1..250 hosts")
        if len(prefix) > 8:
            raise ValueError(f"prefix={prefix!r}: at most 8 characters (interface names)")
        self.n, self.prefix, self.subnet = n, prefix, subnet
        self.rate, self.private_shm = rate, private_shm
        self.bridge = f"{prefix}-br"
        self._procs: list[subprocess.Popen] = []
        self._holders: dict[int, subprocess.Popen] = {}
        self._hosts_file: str | None = None
        self._ssh_file: str | None = None

    # -- names ------------------------------------------------------------------------------
    def ns(self, k: int) -> str:
        """The namespace of host ``k`` (1-based)."""
        return f"{self.prefix}-h{k}"

    def addr(self, k: int) -> str:
        """Host ``k``'s address on the bridge."""
        return f"{self.subnet}.{k}"

    def hostname(self, k: int) -> str:
        return f"host{k}"

    def veth(self, k: int) -> str:
        """The bridge-side end of host ``k``'s link (the host side is ``eth0`` in ``ns(k)``)."""
        return f"{self.prefix}-h{k}a"

    # -- life cycle -------------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        check_support()
        cleanup(self.prefix)
        return super().__enter__()

    def _start(self) -> None:
        if self.private_shm:
            fd, self._hosts_file = tempfile.mkstemp(prefix=f"{self.prefix}-hosts-")
            with os.fdopen(fd, "w") as fh:
                fh.write("127.0.0.1 localhost\n" + "".join(
                    f"{self.addr(k)} {self.hostname(k)}\n" for k in range(1, self.n + 1)))
            os.chmod(self._hosts_file, 0o644)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "link", "set", self.bridge, "up")
        for k in range(1, self.n + 1):
            ns, outer, inner = self.ns(k), self.veth(k), f"{self.prefix}-h{k}b"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            _run("ip", "link", "set", outer, "master", self.bridge)
            _run("ip", "link", "set", outer, "up")
            _run("ip", "link", "set", inner, "netns", ns)
            inside = ("ip", "netns", "exec", ns)
            _run(*inside, "ip", "link", "set", inner, "name", "eth0")
            _run(*inside, "ip", "addr", "add", f"{self.addr(k)}/24", "dev", "eth0")
            _run(*inside, "ip", "link", "set", "eth0", "up")
            _run(*inside, "ip", "link", "set", "lo", "up")
            if self.rate:
                _run(*inside, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                     self.rate, "burst", "256kb", "latency", "50ms")
            self._start_holder(k)

    def _start_holder(self, k: int) -> None:
        script = f"hostname {self.hostname(k)}"
        unshare = ["unshare", "--uts"]
        if self.private_shm:
            unshare += ["--mount", "--propagation", "private"]
            script += " && mount -t tmpfs -o size=50% tmpfs /dev/shm"
            script += f" && mount --bind {shlex.quote(self._hosts_file)} /etc/hosts"
        holder = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(k), *unshare, "sh", "-c",
             script + " && echo ready && exec sleep 2147483647"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._holders[k] = holder
        line = holder.stdout.readline()      # the holder's only output; it sleeps after it
        if line.strip() != "ready":
            holder.kill()
            raise ClusterError(f"host {k}: could not set up its hostname and /dev/shm: "
                               f"{holder.stderr.read().strip()}")

    def close(self) -> None:
        """Kill what still runs in the hosts and delete every namespace and link."""
        for p in self._procs + list(self._holders.values()):
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        for k in range(1, self.n + 1):
            # Processes started in a namespace by other means would keep it alive.
            pids = _run("ip", "netns", "pids", self.ns(k), check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
        cleanup(self.prefix)
        for attr in ("_hosts_file", "_ssh_file"):
            if getattr(self, attr) is not None:
                try:
                    os.unlink(getattr(self, attr))
                except FileNotFoundError:
                    pass
                setattr(self, attr, None)

    # -- running ----------------------------------------------------------------------------
    def command(self, k: int, argv: Sequence[str], cwd: str | None = None) -> list[str]:
        """The argv that runs ``argv`` on host ``k`` (in ``cwd``, default the current one)."""
        if k not in self._holders:
            raise ValueError(f"host {k}: this cluster has hosts 1..{self.n}")
        ns = ["--uts", "--net"] + (["--mount"] if self.private_shm else [])
        # Entering a mount namespace moves to the holder's cwd unless told otherwise.
        return ["nsenter", "-t", str(self._holders[k].pid), *ns, f"--wd={cwd or os.getcwd()}",
                "--", *argv]

    def popen(self, k: int, argv: Sequence[str], cwd: str | None = None,
              **kwargs) -> subprocess.Popen:
        """Start ``argv`` on host ``k``; it is killed when the cluster closes."""
        p = subprocess.Popen(self.command(k, argv, cwd), **kwargs)
        self._procs.append(p)
        return p

    def run(self, k: int, argv: Sequence[str], timeout: float = 30, cwd: str | None = None,
            **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on host ``k`` to completion (text output captured)."""
        return subprocess.run(self.command(k, argv, cwd), capture_output=True, text=True,
                              timeout=timeout, check=False, **kwargs)

    def ssh_stand_in(self) -> str:
        """Path of an executable ``ssh`` stand-in for these hosts (written once, removed on
        close): ``PATH [-x|-q|-T|-n] [-o OPT|-p PORT|-l USER] HOST COMMAND...`` runs COMMAND
        (its words joined by spaces and run by ``sh -c``, as sshd's login shell would) on the
        host named ``host<K>`` or ``<subnet>.K``, in the current directory, through nsenter
        into that host's namespaces, and exits with its status (255: no such host, as ssh).
        Processes it starts are in the host's network namespace, so :meth:`close` kills
        them. E.g. ``mpiexec -launcher ssh -launcher-exec PATH -hosts host1,host2 ...`` run
        on host 1 starts Hydra's proxy on host 2 with it.
        """
        if self._ssh_file is None:
            cases = "".join(f"    {self.hostname(k)}|{self.addr(k)}) pid={holder.pid} ;;\n"
                            for k, holder in sorted(self._holders.items()))
            ns = "--uts --net" + (" --mount" if self.private_shm else "")
            script = f"""#!/bin/sh
# ssh stand-in for the emulated cluster {self.prefix} (benchmarks/cluster/netns.py)
while [ $# -gt 0 ]; do
    case "$1" in
    -o|-p|-l|-i|-F) shift 2 ;;
    -*) shift ;;
    *) break ;;
    esac
done
[ $# -ge 2 ] || {{ echo "usage: $0 [options] HOST COMMAND..." >&2; exit 255; }}
host=$1
shift
case "$host" in
{cases}    *) echo "$0: no emulated host $host in {self.prefix}" >&2; exit 255 ;;
esac
exec nsenter -t "$pid" {ns} --wd="$PWD" -- sh -c "$*"
"""
            fd, path = tempfile.mkstemp(prefix=f"{self.prefix}-ssh-", suffix=".sh")
            with os.fdopen(fd, "w") as fh:
                fh.write(script)
            os.chmod(path, 0o755)
            self._ssh_file = path
        return self._ssh_file

    def unplug(self, k: int) -> None:
        """Pull host ``k``'s cable: delete its link (both veth ends go)."""
        _run("ip", "link", "del", self.veth(k))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cleanup", action="store_true",
                    help="remove namespaces and links left by a killed run, then exit")
    ap.add_argument("--prefix", default=PREFIX)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--rate", default=None, help="tc tbf rate per host, e.g. 2gbit")
    ap.add_argument("--no-private-shm", action="store_true")
    ap.add_argument("--on", type=int, default=None, metavar="K",
                    help="run the command on host K only (e.g. an mpiexec that reaches the "
                         "others through {ssh})")
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="run on every host at once; {host} (1-based), {node} (0-based), {addr}, "
                         "{master} (host 1's address) and {ssh} (an ssh stand-in that runs a "
                         "command on a named host: Cluster.ssh_stand_in) are substituted")
    args = ap.parse_args(argv)
    if args.cleanup:
        for name in cleanup(args.prefix):
            print("removed", name)
        return 0
    with Cluster(args.hosts, prefix=args.prefix, rate=args.rate,
                 private_shm=not args.no_private_shm) as c:
        if not args.command:
            for k in range(1, c.n + 1):
                print(c.ns(k), c.hostname(k), c.addr(k))
            return 0
        command = args.command[1:] if args.command[0] == "--" else args.command
        ssh = c.ssh_stand_in() if any("{ssh}" in a for a in command) else ""
        subst = lambda a, k: (a.replace("{host}", str(k)).replace("{addr}", c.addr(k))
                              .replace("{node}", str(k - 1))
                              .replace("{master}", c.addr(1)).replace("{ssh}", ssh))
        hosts = range(1, c.n + 1) if args.on is None else [args.on]
        procs = [c.popen(k, [subst(a, k) for a in command]) for k in hosts]
        return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
