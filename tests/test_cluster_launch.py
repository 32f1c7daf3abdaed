"""The multi-node launcher on one host (issue 16): two launch.py agents of a 2-node job on
this host, no namespaces: which rank reads stdin (and that no other rank hangs on it), and
the usage errors of a multi-node job's shape.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.cluster.jobcheck import ROOT, clean_env

# -- stdin of a multi-node job (two agents on this host, no namespaces) ----------------------
STDIN_APP = """\
import sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
reader = int(sys.argv[1])
if comm.rank == reader:
    lines = [line.rstrip("\\n") for line in sys.stdin]
    sys.stdout.write("rank %d read %d lines: %r\\n" % (comm.rank, len(lines), lines))
else:
    t0 = time.monotonic()
    data = sys.stdin.read()
    # one write per line: the ranks of a node share its unprefixed output, and print()
    # under PYTHONUNBUFFERED writes the text and its newline apart
    sys.stdout.write("rank %d read %r in %.1f s\\n" % (comm.rank, data, time.monotonic() - t0))
sys.stdout.flush()
comm.Barrier()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_argv(k: int, port: int, opts: tuple[str, ...], program: list[str]) -> list[str]:
    return [sys.executable, str(ROOT / "launch.py"), "--nnodes", "2", "--node-rank", str(k),
            "--master-addr", "127.0.0.1", "--master-port", str(port), "--nproc-per-node", "2",
            "--mpi4py", *opts, *program]


def _wait_for_lines(paths: list[Path], needles: list[str], procs, timeout: float) -> None:
    """Wait until every needle is in one of the files (fail early if a node exits)."""
    deadline = time.monotonic() + timeout
    while True:
        text = "".join(p.read_text() for p in paths)
        if all(n in text for n in needles):
            return
        gone = [p.returncode for p in procs if p.poll() is not None]
        assert not gone and time.monotonic() < deadline, \
            f"waiting for {needles} (nodes exited: {gone}):\n{text}"
        time.sleep(0.05)


@pytest.mark.usefixtures("no_shared_world")
@pytest.mark.parametrize("opts,reader,node", [
    ((), 0, 0),                                     # the default: node 0's stdin, rank 0
    (("--stdin", "3"), 3, 1),                       # block: rank 3 is on node 1
    (("--placement", "cyclic", "--stdin", "1"), 1, 1),    # cyclic: rank 1 is on node 1
    (("--stdin", "none"), None, None)],
    ids=["default", "rank3-block", "rank1-cyclic", "none"])
def test_stdin_of_the_node_hosting_the_stdin_rank_reaches_it(tmp_path, opts, reader, node):
    """Both launch.py get a pipe that the test holds open: the ranks that are not --stdin's
    read EOF at once (no hang on a terminal-like stdin), the other node's launch.py does not
    hold its pipe (a write is EPIPE), and the lines written to the hosting node's launch.py
    all reach the --stdin rank, which reads to EOF."""
    app = tmp_path / "stdin_app.py"
    app.write_text(STDIN_APP)
    port = _free_port()
    outs = [tmp_path / f"node{k}.out" for k in range(2)]
    procs = []
    try:
        for k in range(2):
            with open(outs[k], "wb") as out:
                procs.append(subprocess.Popen(
                    _node_argv(k, port, opts, [str(app), "-1" if reader is None else str(reader)]),
                    cwd=str(ROOT), env=clean_env(PYCOMM_TIMEOUT="20"), stdin=subprocess.PIPE, stdout=out,
                    stderr=subprocess.STDOUT, bufsize=0))
        others = [r for r in range(4) if r != reader]
        _wait_for_lines(outs, [f"rank {r} read '' in " for r in others], procs, 30)
        for k, proc in enumerate(procs):
            if k != node:           # that agent let go of its stdin before starting ranks
                with pytest.raises(BrokenPipeError):
                    proc.stdin.write(b"nobody reads this\n")
        if node is not None:
            procs[node].stdin.write(b"alpha\nbeta\ngamma\n")
            procs[node].stdin.close()
        for proc in procs:
            proc.wait(timeout=30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    texts = [p.read_text() for p in outs]
    for k, proc in enumerate(procs):
        assert proc.returncode == 0, f"node {k}:\n{texts[k]}"
    for r in others:
        took = re.search(rf"rank {r} read '' in ([0-9.]+) s", "".join(texts))
        assert took is not None and float(took.group(1)) < 5.0, texts
    if node is not None:
        assert f"rank {reader} read 3 lines: ['alpha', 'beta', 'gamma']" in texts[node], \
            texts
    assert "nobody reads this" not in "".join(texts)


def test_stdin_rank_outside_the_multi_node_world_is_a_usage_error(tmp_path):
    marker = tmp_path / "ran"
    app = tmp_path / "app.py"
    app.write_text(f"open({str(marker)!r}, 'w').close()\n")
    port = _free_port()
    proc = subprocess.run(_node_argv(0, port, ("--stdin", "7"), [str(app)]), cwd=str(ROOT),
                          env=clean_env(PYCOMM_TIMEOUT="20"), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "--stdin must be a rank in 0..3 or 'none', got '7' (the world of --nnodes 2 x " \
        "--nproc-per-node 2)" in proc.stderr
    assert proc.stdout == "" and not marker.exists()
    with socket.socket() as s:      # node 0's store never bound its port
        s.bind(("0.0.0.0", port))


@pytest.mark.parametrize("opts,message", [
    (["--nnodes", "0"], "--nnodes must be at least 1, got 0"),
    (["--nnodes", "2", "--node-rank", "2"], "--node-rank must be in 0..1, got 2"),
    (["--nnodes", "2", "--nproc-per-node", "0"], "--nproc-per-node must be at least 1, got 0"),
    (["--nnodes", "2", "--stdin", "-1"], "--stdin must be a rank in 0..1 or 'none', got '-1'")])
def test_multi_node_shape_errors_are_usage_errors(opts, message, capsys):
    from pycomm.launch.cli import main
    with pytest.raises(SystemExit) as exc:
        main([*opts, "app.py"])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err



# -- a failure on the node that hosts the store --------------------------------------------
FAILING_APP = """\
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
if comm.rank == 0:
    raise RuntimeError("rank 0 fails")
comm.Barrier()
"""


@pytest.mark.usefixtures("no_shared_world")
def test_every_agent_names_a_failure_on_the_node_that_hosts_the_store(tmp_path):
    """Node 0 keeps the store up until node 1 has read why the job ends: without that,
    node 1 lost the store first in about half the runs and said only that."""
    app = tmp_path / "app.py"
    app.write_text(FAILING_APP)
    # three jobs (each its own port), started together: each is a short run of starting
    # processes, and the race it looks for is between the two agents of one job
    jobs, ports = [], set()
    for _ in range(3):
        while (port := _free_port()) in ports:     # three different stores (and job ids)
            pass
        ports.add(port)
        jobs.append([subprocess.Popen(_node_argv(k, port, (), [str(app)]), cwd=str(ROOT),
                                      env=clean_env(PYCOMM_JOB_TOKEN="failing-node"),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
                     for k in (0, 1)])
    for nodes in jobs:
        outs = [node.communicate(timeout=90)[1] for node in nodes]
        for node, err in zip(nodes, outs):
            assert node.returncode == 1, err
            assert re.search(r"^pycomm.launch\[.+\]: job failed: rank 0 on host .+ \(node 0\) "
                             r"failed: rank 0 \(pid \d+\) exited with code 1; stopping the",
                             err, re.M), err
            assert "lost the job's store" not in err


# -- which rank the agents name when failures cascade across nodes (no processes) -----------
class _Exited:
    """A rank process that has ended with ``returncode`` (what the agent polls)."""

    def __init__(self, pid: int, returncode: int | None):
        self.pid, self.returncode = pid, returncode

    def poll(self) -> int | None:
        return self.returncode


def _two_agents(port: int, running: bool = False):
    from pycomm.launch.nodes import NodeAgent
    agents = [NodeAgent(2, k, 2, "127.0.0.1", port, timeout=20.0) for k in (0, 1)]
    agents[1].hostname = "host2"
    for agent in agents:
        agent.connect()
    # node 0: rank 0 failed (a PeerError naming rank 3), rank 1 still running;
    # node 1: rank 2 running, rank 3 failed unless `running`
    agents[0].procs = [_Exited(100, 1), _Exited(101, None)]
    agents[1].procs = [_Exited(102, None), _Exited(103, None if running else 1)]
    import msgpack
    from pycomm import stall
    agents[0]._client.set(stall.key(agents[0].job_id, "diag", 0), msgpack.packb(
        {"culprits": [3], "call": "Allreduce #3 on pycomm.COMM_WORLD",
         "error": "PeerError: rank 0: peer 3 left"}))
    return agents


@pytest.mark.parametrize("first", [0, 1], ids=["consequence-seen-first", "culprit-seen-first"])
def test_every_agent_names_the_rank_that_failed_first_on_another_node(first):
    """The race seen once in a CI run: rank 3 (node 1) fails; rank 0 (node 0) raises a
    PeerError naming it and exits; node 0's agent sees its own rank's exit before node 1's
    agent has looked at rank 3. Whichever agent looks first, both name rank 3 on host2."""
    import threading
    from pycomm.launch.launcher import RankExit
    agents = _two_agents(_free_port())
    try:
        verdicts: dict[int, str] = {}
        failing = {0: RankExit(0, 100, 1), 1: RankExit(3, 103, 1)}
        def look(k: int) -> None:
            verdicts[k] = agents[k]._publish_failure(failing[k])
        judge = threading.Thread(target=look, args=(first,))
        judge.start()
        time.sleep(0.3)             # the other agent's poll comes later
        look(1 - first)
        judge.join(10)
        assert verdicts[0] == verdicts[1], verdicts
        assert verdicts[0].startswith(
            "rank 3 on host host2 (node 1) failed: rank 3 (pid 103) exited with code 1"), \
            verdicts
        if first == 0:
            assert "; ranks [0] name it in Allreduce #3 on pycomm.COMM_WORLD: PeerError: " \
                   "rank 0: peer 3 left; first to exit: rank 0 on host " in verdicts[0]
        else:
            assert "name it" not in verdicts[0]     # the judge's own rank was the culprit
    finally:
        for agent in reversed(agents):
            agent.procs = []        # no process behind them: nothing for close() to stop
            agent.close()


def test_a_blamed_rank_still_running_on_another_node_is_named_so():
    """The blamed rank's agent records nothing (its rank is stuck, not dead): the judge
    waits at most 2 s for it, then names it still running, with its host and node."""
    from pycomm.launch.launcher import RankExit
    agents = _two_agents(_free_port(), running=True)
    try:
        t0 = time.monotonic()
        verdict = agents[0]._publish_failure(RankExit(0, 100, 1))
        assert 1.9 < time.monotonic() - t0 < 5
        assert verdict.startswith("rank 3 on host host2 (node 1) caused the failure and is "
                                  "still running; ranks [0] name it"), verdict
        assert agents[1]._abort_said() == verdict
    finally:
        for agent in reversed(agents):
            agent.procs = []        # no process behind them: nothing for close() to stop
            agent.close()


def test_an_interrupted_launcher_names_itself_not_a_rank():
    """SIGINT to node 1's launcher: every agent reads that the launcher of node 1 got it;
    no rank is named as failed (none did). A failure seen afterwards gets that verdict."""
    import signal
    from pycomm.launch.launcher import RankExit
    agents = _two_agents(_free_port(), running=True)
    try:
        verdict = agents[1]._publish_interrupt(signal.SIGINT)
        assert verdict == "the launcher of node 1 on host host2 got SIGINT"
        assert agents[0]._abort_said() == verdict
        assert agents[0]._publish_failure(RankExit(0, 100, 1)) == verdict
    finally:
        for agent in reversed(agents):
            agent.procs = []
            agent.close()
