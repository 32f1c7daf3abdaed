"""The node agent of a multi-node job: ``launch.py --nnodes N --node-rank K ...`` (torchrun's model).

Run once per node::

    python launch.py --nnodes 2 --node-rank 0 --master-addr HOST0 --nproc-per-node 2 app.py
    python launch.py --nnodes 2 --node-rank 1 --master-addr HOST0 --nproc-per-node 2 app.py

The world has N x M ranks. ``--placement block`` (default) gives node K the ranks
K*M .. K*M+M-1; ``cyclic`` gives node K the ranks K, K+N, K+2N, ... (srun's
``--distribution=cyclic``). The agent of node rank 0 hosts the rendezvous store on
``0.0.0.0:--master-port``; every agent and rank reaches it at ``--master-addr``. Each agent
starts and supervises its node's ranks (own session, parent-death signal, ``[rank]``
prefixed output, /dev/shm swept at the end) and meets the others through the store:

* a rank that fails (non-zero exit or a signal) makes its agent record it — host, rank,
  how it ended — under ``nodes/<job>/failed/<rank>``. The first agent to record one is the
  judge: the rank that failed first on one node may only have lost a peer that failed on
  another, a moment earlier, whose agent has not looked yet. The judge reads the ranks'
  diagnoses (:func:`pycomm.launch.launcher.blame`: a ``PeerError`` names the dead peer); when they
  blame a rank other than its own, it waits (at most :data:`_CULPRIT_WAIT_S`) for that
  rank's record, and publishes the verdict under ``nodes/<job>/abort``. Every agent polls
  that key every :data:`_POLL_S` seconds, so every node prints the same line naming the
  failing host and rank and stops its ranks (SIGTERM, SIGKILL after ``PYCOMM_KILL_GRACE``)
  within a second or two; node 0 keeps the store up until every agent has read why the job
  ends (at most 5 s);
* an agent whose ranks all exited 0 says so; node 0 keeps the store up until every node has
  (or a failure, or ``--timeout``), so no rank loses the store while it still needs it;
* a rank that calls ``Comm.Abort(code)`` publishes an abort note (:mod:`pycomm.stall`) and
  waits; every agent reads it within :data:`_POLL_S`, stops its ranks and exits with ``code``;
* an agent that loses the store (node 0 gone) stops its ranks and says so.

stdin, as under ``mpiexec``: the rank named by ``--stdin`` (default 0; ``none`` for nobody;
give the same on every node) reads the stdin of the ``launch.py`` on the node that hosts it
(node 0 hosts rank 0 under either placement, so by default node 0's stdin is rank 0's); the
agent passes it on unread. Every other rank reads /dev/null, and the agents of the other
nodes put /dev/null in place of their own stdin at the start (:func:`run_nodes`), so that
nothing on those nodes reads or holds it open: a pipe into such a ``launch.py`` breaks
(EPIPE) instead of filling up.

The job secret is ``PYCOMM_JOB_TOKEN`` when set (the same on every node); else it is derived
from the job's shape and store address, which keeps other jobs out but is no secret.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence

from pycomm import config, stall
from pycomm.errors import ArgumentError, CommError, CommTimeoutError
from pycomm.launch import forkserver
from pycomm.launch.forkserver import _preexec
from pycomm.launch.forward import say
from pycomm.launch.launcher import (RankExit, _Forwarder, blame, contract_env,
                                   sweep_shm)
from pycomm.launch.store import StoreServer
from pycomm.launch.store_client import StoreClient

__all__ = ["NodeAgent", "global_rank"]

_POLL_S = 0.1           # seconds between checks of the local ranks and the abort key
_DONE_WAIT_S = 3600.0   # longest node 0 keeps the store for the others without --timeout
_READ_WAIT_S = 5.0      # longest node 0 keeps the store for the others to read a failure
_CULPRIT_WAIT_S = 2.0   # longest the judge waits for the blamed rank's agent to record it
_VERDICT_WAIT_S = 10.0  # longest an agent waits for the judge's verdict


def global_rank(node: int, local: int, nnodes: int, nproc: int, placement: str) -> int:
    """World rank of local rank ``local`` on node ``node``.

    block:  node 0 -> 0..M-1, node 1 -> M..2M-1, ...
    cyclic: node 0 -> 0, N, 2N, ...; node 1 -> 1, N+1, ...
    """
    if placement == "block":
        return node * nproc + local
    if placement == "cyclic":
        return local * nnodes + node
    raise ArgumentError(f"placement={placement!r}: use block or cyclic")


class NodeAgent:
    """Start and supervise this node's ranks of an N-node job (see the module docstring).

    Args:
        nnodes, node_rank, nproc_per_node: the job's shape and this node's place in it.
        master_addr, master_port: where node 0's agent hosts the store (default port 29500).
        placement: "block" or "cyclic".
        transport, timeout, prefix: as :class:`pycomm.launch.launcher.RankGroup`.
        stdin_rank: the world rank that reads this process's stdin when this node hosts
            it (None: every rank reads /dev/null); see :attr:`hosts_stdin`.

    Raises:
        ArgumentError: an inconsistent shape or placement.
    """

    def __init__(self, nnodes: int, node_rank: int, nproc_per_node: int, master_addr: str,
                 master_port: int = 29500, *, placement: str = "block",
                 transport: str = "auto", timeout: float | None = None, prefix: bool = True,
                 stdin_rank: int | None = None):
        if nnodes < 1 or not 0 <= node_rank < nnodes or nproc_per_node < 1:
            raise ArgumentError(f"--nnodes {nnodes} --node-rank {node_rank} --nproc-per-node "
                                f"{nproc_per_node}: need 0 <= node rank < nnodes and >= 1 "
                                "process per node")
        if not 0 < master_port < 65536:
            raise ArgumentError(f"--master-port {master_port}: need 1..65535")
        self.nnodes, self.node_rank, self.nproc = nnodes, node_rank, nproc_per_node
        self.size = nnodes * nproc_per_node
        if stdin_rank is not None and not 0 <= stdin_rank < self.size:
            raise ArgumentError(f"--stdin {stdin_rank}: need a rank in 0..{self.size - 1} "
                                f"(the world of {nnodes} x {nproc_per_node}) or none")
        self.stdin_rank = stdin_rank
        self.placement = placement
        self.ranks = [global_rank(node_rank, i, nnodes, nproc_per_node, placement)
                      for i in range(nproc_per_node)]
        self.master_addr, self.master_port = master_addr, master_port
        self.transport, self.timeout, self.prefix = transport, timeout, prefix
        self.grace = float(config.get("PYCOMM_KILL_GRACE"))
        self.hostname = socket.gethostname()
        shape = f"{nnodes}x{nproc_per_node}:{placement}:{master_addr}:{master_port}"
        self.token = (config.get("PYCOMM_JOB_TOKEN")
                      or hashlib.sha256(b"pycomm-nodes:" + shape.encode()).hexdigest())
        self.job_id = "n" + hashlib.sha256(shape.encode()).hexdigest()[:11]
        self.server = (StoreServer(self.token, "0.0.0.0", master_port)
                       if node_rank == 0 else None)
        self.procs: list[subprocess.Popen] = []
        self._forwarders: list[_Forwarder] = []
        self._client: StoreClient | None = None
        self._key = f"nodes/{self.job_id}/"

    @property
    def hosts_stdin(self) -> bool:
        """Whether one of this node's ranks reads this process's stdin (``stdin_rank``)."""
        return self.stdin_rank in self.ranks

    def env_for(self, local: int) -> dict[str, str]:
        """The environment contract for this node's ``local``-th rank."""
        return contract_env(self.ranks[local], self.size, local, self.nproc, self.master_addr,
                            self.master_port, self.token, self.job_id, self.transport,
                            self.timeout)

    def connect(self) -> None:
        """Connect to the job's store and record this node's hostname there."""
        wait = self.timeout or float(config.get("PYCOMM_TIMEOUT"))
        self._client = StoreClient(self.master_addr, self.master_port, self.token,
                                   timeout=wait)
        self._client.set(self._key + f"host/{self.node_rank}", self.hostname.encode())

    def start(self, argv: Sequence[str], extra_env: dict[str, str] | None = None) -> None:
        """Connect to the store, then start this node's ranks as ``sys.executable *argv``."""
        self.connect()
        envs = [{**os.environ, **(extra_env or {}), **self.env_for(local)}
                for local in range(len(self.ranks))]
        self.procs = forkserver.start_ranks(
            argv, envs, self.ranks.index(self.stdin_rank) if self.hosts_stdin else None,
            self.prefix, _preexec(os.getpid()))
        for rank, proc in zip(self.ranks, self.procs):
            if self.prefix:
                for stream, src in (("stdout", proc.stdout), ("stderr", proc.stderr)):
                    fwd = _Forwarder(src, rank, stream)
                    fwd.start()
                    self._forwarders.append(fwd)

    # -- supervision ------------------------------------------------------------------------
    def _failures(self) -> list[RankExit]:
        """This node's ranks that have failed (a non-zero exit or a signal)."""
        return [RankExit(self.ranks[local], proc.pid, proc.returncode)
                for local, proc in enumerate(self.procs) if proc.poll()]

    def _failed(self) -> RankExit | None:
        failures = self._failures()
        return failures[0] if failures else None

    def _running(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p.poll() is None]

    def _publish_failure(self, failure: RankExit) -> str:
        """Record this node's failure; the first agent to record one judges (see the module
        docstring). Return the job's verdict.

        Raises:
            CommError: the store failed, or the judge gave no verdict in time.
        """
        assert self._client is not None
        mine = self._failure_line(failure)
        # every failed rank of this node, recorded before the count: a judge that blames
        # one of them finds it
        for exited in [failure] + [f for f in self._failures() if f.rank != failure.rank]:
            self._client.set(self._key + f"failed/{exited.rank}",
                             self._failure_line(exited).encode())
        return self._verdict(lambda: self._judge(failure.rank, mine))

    def _publish_interrupt(self, sig: int) -> str:
        """Publish that this node's launcher got signal ``sig`` (no rank failed: none is
        named), unless another verdict was first; return the job's verdict."""
        return self._verdict(lambda: f"the launcher of node {self.node_rank} on host "
                                     f"{self.hostname} got {signal.Signals(sig).name}")

    def _verdict(self, judge: Callable[[], str]) -> str:
        """The job's verdict: ``judge()``'s when this agent is the first to give one, else
        the first's (waited for at most :data:`_VERDICT_WAIT_S`)."""
        assert self._client is not None
        if self._client.add(self._key + "abort#", 1) == 1:
            verdict = judge()
            self._client.set(self._key + "abort", verdict.encode())
            return verdict
        return self._client.get(self._key + "abort",
                                timeout=_VERDICT_WAIT_S).decode(errors="replace")

    def _failure_line(self, failure: RankExit) -> str:
        return (f"rank {failure.rank} on host {self.hostname} (node {self.node_rank}) "
                f"failed: {failure.describe()}")

    def node_of(self, rank: int) -> int:
        """The node rank that runs world rank ``rank`` (the inverse of :func:`global_rank`)."""
        return rank // self.nproc if self.placement == "block" else rank % self.nnodes

    def _judge(self, first: int, mine: str) -> str:
        """The verdict of the first agent to see a failure, its own rank ``first``'s
        (recorded as ``mine``): the rank the ranks' diagnoses blame, as its agent recorded
        it, else ``first``."""
        assert self._client is not None
        diags = stall.read_diagnoses(self._client, self.job_id, range(self.size))
        blamed = blame(diags)
        if blamed is None or blamed[0] == first:
            return mine
        culprit, accusers = blamed
        node = self.node_of(culprit)
        # this node's failed ranks are recorded already; another's agent may not have looked
        wait = 0.0 if node == self.node_rank else _CULPRIT_WAIT_S
        try:
            line = self._client.get(self._key + f"failed/{culprit}",
                                    timeout=wait).decode(errors="replace")
        except CommTimeoutError:        # still running (stuck, or stopped by a signal)
            try:
                host = self._client.get(self._key + f"host/{node}", timeout=0.0).decode()
            except CommTimeoutError:
                host = "?"
            line = (f"rank {culprit} on host {host} (node {node}) caused the failure and "
                    "is still running")
        diag = diags[accusers[0]]
        call = diag.get("call")
        error = (diag.get("error") or "").splitlines()[:1]
        return (f"{line}; ranks {accusers} name it{' in ' + call if call else ''}"
                f"{': ' + error[0][:600] if error else ''}; first to exit: {mine}")

    def _abort_said(self) -> str | None:
        assert self._client is not None
        if self._client.add(self._key + "abort#", 0) == 0:
            return None
        return self._client.get(self._key + "abort",
                                timeout=_VERDICT_WAIT_S).decode(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, *, freeze: bool = False) -> None:
        """SIGTERM (and SIGCONT) the running ranks' groups, SIGKILL them after the grace.

        ``freeze``: SIGSTOP them first, so that none runs between two signals and sees
        another gone (:meth:`pycomm.launch.launcher.RankGroup.stop`)."""
        for s in ((signal.SIGSTOP,) if freeze else ()) + (sig, signal.SIGCONT):
            for p in self._running():
                try:
                    os.killpg(p.pid, s)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + self.grace
        while self._running() and time.monotonic() < deadline:
            time.sleep(0.02)
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.procs:
            try:
                p.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass

    def supervise(self, interrupted: Callable[[], int | None] = lambda: None,
                  log: Callable[[str], None] | None = None) -> int:
        """Wait for the job to end on every node; return this agent's exit code.

        Returns:
            0 when the whole job succeeded; the failing rank's exit code when one of this
            node's ranks failed; 1 when a rank on another node failed (or the store was
            lost); 128 + signal number when interrupted.
        """
        log = log or (lambda msg: say(f"pycomm.launch[{self.hostname}]: {msg}"))
        try:
            while True:
                sig = interrupted()
                if sig is not None:
                    log(f"got {signal.Signals(sig).name}; stopping this node's ranks")
                    self._publish_interrupt(sig)
                    self._ending(lambda: self.stop(sig))
                    return 128 + sig
                failure = self._failed()
                if failure is not None:
                    verdict = self._publish_failure(failure)
                    log(f"job failed: {verdict}; stopping the {len(self._running())} "
                        "running ranks of this node")
                    self._ending(self.stop)
                    return failure.exit_code
                said = self._abort_said()
                if said is not None:
                    log(f"job failed: {said}; stopping the {len(self._running())} running "
                        "ranks of this node")
                    self._ending(self.stop)
                    return 1
                aborted = stall.read_abort(self._client, self.job_id)
                if aborted is not None:
                    log(f"rank {aborted[0]} called Abort({aborted[1]}); stopping the "
                        f"{len(self._running())} running ranks of this node")
                    self._ending(lambda: self.stop(freeze=True))
                    return aborted[1] & 0xFF
                if not self._running():
                    return self._finish(log)
                time.sleep(_POLL_S)
        except CommError as exc:
            log(f"lost the job's store at {self.master_addr}:{self.master_port} ({exc}); "
                "stopping this node's ranks")
            self.stop()
            return 1

    def _ending(self, stop: Callable[[], None]) -> None:
        """This agent knows why the job ends: count it under ``ending#``, stop this node's
        ranks, and on node 0, which hosts the store, keep it up (at most ``_READ_WAIT_S``)
        until every agent has counted itself, so that none loses the store before it has
        read why (it would then say it lost the store and exit 1, whatever the reason)."""
        self._client.add(self._key + "ending#", 1)
        stop()
        if self.node_rank != 0:
            return
        deadline = time.monotonic() + _READ_WAIT_S
        while self._client.add(self._key + "ending#", 0) < self.nnodes and \
                time.monotonic() < deadline:
            time.sleep(_POLL_S / 2)

    def _finish(self, log: Callable[[str], None]) -> int:
        """This node's ranks all exited 0: say so; node 0 waits for the others to finish."""
        assert self._client is not None
        done = self._client.add(self._key + "done#", 1)
        if self.node_rank != 0:
            return 0
        deadline = time.monotonic() + (self.timeout or _DONE_WAIT_S)
        while done < self.nnodes:
            said = self._abort_said()
            if said is not None:
                log(f"job failed: {said}")
                return 1
            if time.monotonic() >= deadline:
                log(f"only {done} of {self.nnodes} nodes finished within the timeout")
                return 1
            time.sleep(_POLL_S)
            done = self._client.add(self._key + "done#", 0)
        return 0

    def close(self) -> None:
        """Kill what is left, close the store (node 0), sweep this node's /dev/shm."""
        if self._running():
            self.stop()
        deadline = time.monotonic() + 2.0
        for fwd in self._forwarders:
            fwd.join(max(0.0, deadline - time.monotonic()))
        if self._client is not None:
            self._client.close()
        if self.server is not None:
            self.server.close()
        sweep_shm(self.job_id)

    def __enter__(self) -> NodeAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _release_stdin() -> None:
    """Put /dev/null in place of this process's fd 0: its stdin is no longer read or held."""
    null = os.open(os.devnull, os.O_RDONLY)
    if null != 0:               # fd 0 was open (else /dev/null took its place already)
        os.dup2(null, 0)
        os.close(null)


def run_nodes(args, program: list[str], extra_env: dict[str, str] | None = None,
              stdin_rank: int | None = None) -> int:
    """``launch.py --nnodes ...``: run this node's agent until the job ends.

    ``stdin_rank`` (``--stdin``) reads this process's stdin if this node hosts it; if it
    does not, this process's own stdin is replaced by /dev/null before the ranks start.
    """
    got_signal: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        got_signal.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with NodeAgent(args.nnodes, args.node_rank, args.nproc_per_node, args.master_addr,
                       args.master_port or 29500, placement=args.placement,
                       transport=args.transport, timeout=args.timeout,
                       prefix=not args.no_prefix, stdin_rank=stdin_rank) as agent:
            if not agent.hosts_stdin:
                _release_stdin()
            agent.start(program, extra_env)
            return agent.supervise(lambda: got_signal[0] if got_signal else None)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
