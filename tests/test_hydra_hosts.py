"""Multi-host MPICH Hydra (issue 16): a real ``mpiexec`` across emulated hosts, and the PMI
client (pycomm/launch/pmi.py) through which its ranks find rank 0's store with no MASTER_ADDR.

The real jobs run ``mpiexec -launcher ssh -launcher-exec STAND_IN -hosts host1,host2 ...``
on emulated host 1 (benchmarks/cluster/netns.py); the stand-in runs Hydra's proxy in the
named host's namespaces where ssh would log in, so Hydra, its proxies, their PMI
connections and the ranks are all real. They are skipped, with the reason, where network
namespaces cannot be made or no MPICH ``mpiexec`` is installed (``pip install mpich``; not a
pycomm dependency). The PMI tests without namespaces run against a fake proxy.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import quote_plus

import numpy as np
import pytest

from benchmarks.cluster.jobcheck import (APP, ROOT, assert_lines, clean_env, emulated_hosts,
                                         finish, hosts_left_clean, launcher, port_taken)
from pycomm.launch import pmi
from pycomm.launch.bootstrap import _pmi_rendezvous
from pycomm.launch.jobenv import JobEnv, detect
from pycomm.errors import ArgumentError, CommError, CommTimeoutError, ProtocolError


# -- the PMI-1 wire protocol and client, against a fake Hydra proxy -------------------------
class FakeProxy:
    """Hydra's side of PMI-1 for ``n`` processes: one socketpair each (the PMI_FD a proxy
    hands its children), a shared key-value space, a barrier over all ``n``; one thread per
    connection. ``silent`` connections get no reply to anything (a wedged proxy)."""

    def __init__(self, n: int, kvsname: str = "kvs_4242_0_1_host1", silent: bool = False):
        self.kvsname, self.silent = kvsname, silent
        self.kvs: dict[str, str] = {}
        self.seen: list[str] = []
        self._barrier = threading.Barrier(n)
        pairs = [socket.socketpair() for _ in range(n)]
        self.fds = [theirs.detach() for _, theirs in pairs]     # handed to the clients
        self._threads = [threading.Thread(target=self._serve, args=(mine,), daemon=True)
                         for mine, _ in pairs]
        for t in self._threads:
            t.start()

    def _serve(self, sock: socket.socket) -> None:
        with sock, sock.makefile("rb") as lines:
            for raw in lines:
                f = pmi.parse(raw.rstrip(b"\n"))
                self.seen.append(f["cmd"])
                if self.silent:
                    continue
                reply = {"init": "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1",
                         "get_my_kvsname": f"cmd=my_kvsname rc=0 kvsname={self.kvsname}",
                         "finalize": "cmd=finalize_ack rc=0"}.get(f["cmd"])
                if f["cmd"] == "put":
                    self.kvs[f["key"]] = f["value"]
                    reply = "cmd=put_result rc=0"
                elif f["cmd"] == "barrier_in":
                    try:
                        self._barrier.wait(30)
                    except threading.BrokenBarrierError:     # the test gave up on it
                        return
                    reply = "cmd=barrier_out"
                elif f["cmd"] == "get":
                    reply = (f"cmd=get_result rc=0 value={self.kvs[f['key']]}"
                             if f["key"] in self.kvs else "cmd=get_result rc=1")
                sock.sendall((reply or "cmd=unknown rc=1").encode() + b"\n")
                if f["cmd"] == "finalize":
                    return


def test_pmi_lines_encode_and_parse():
    assert pmi.encode("put", kvsname="k", key="a", value="1%2C2") == \
        b"cmd=put kvsname=k key=a value=1%2C2\n"
    assert pmi.parse(b"cmd=get_result rc=0 value=x") == \
        {"cmd": "get_result", "rc": "0", "value": "x"}
    with pytest.raises(ArgumentError, match="space"):
        pmi.encode("put", value="a b")
    for bad in (b"rc=0", b"cmd=x junk", "cmd=\u00e9".encode()):
        with pytest.raises(ProtocolError, match="PMI"):
            pmi.parse(bad)


def test_pmi_client_puts_barriers_and_gets_any_text():
    proxy = FakeProxy(2)
    text = "10.0.0.1,29500,ab cd=ef\u00e9"          # spaces, '=' and non-ASCII survive
    got = {}

    def process(i):
        with pmi.Client(pmi.Endpoint(fd=proxy.fds[i]), timeout=10) as c:
            if i == 0:
                c.put("k", text)
            c.barrier()
            got[i] = (c.get("k"), c.kvsname)
            with pytest.raises(CommError, match="no process of the job published 'nokey'"):
                c.get("nokey")
    threads = [threading.Thread(target=process, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert got == {0: (text, proxy.kvsname), 1: (text, proxy.kvsname)}
    assert proxy.seen.count("finalize") == 2
    for long in ("x y" * 1000, "\u00e9," * 1000):       # cut to fit once encoded
        fitted = pmi.fit(long)
        assert long.startswith(fitted) and 900 < len(quote_plus(fitted, safe="")) <= 1024
    assert pmi.fit("short") == "short"


def test_pmi_client_times_out_naming_the_barrier_and_the_connection():
    proxy = FakeProxy(2)                    # the second process never comes
    c = pmi.Client(pmi.Endpoint(fd=proxy.fds[0]), timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(CommTimeoutError, match=rf"no barrier_out .*PMI_FD={proxy.fds[0]}\) "
                                                r"within 0.5 s: a barrier waits"):
        c.barrier()
    assert time.monotonic() - t0 < 3
    proxy._barrier.abort()
    c.close()
    os.close(proxy.fds[1])


def test_pmi_client_reports_a_silent_or_closed_proxy():
    silent = FakeProxy(1, silent=True)
    with pytest.raises(CommTimeoutError, match="no response_to_init"):
        pmi.Client(pmi.Endpoint(fd=silent.fds[0]), timeout=0.3)
    a, b = socket.socketpair()
    b.close()
    with pytest.raises(CommError, match=rf"PMI_FD={a.fileno()}.*(closed|failed)"):
        pmi.Client(pmi.Endpoint(fd=a.detach()), timeout=2)


def test_pmi_client_dials_pmi_port_and_learns_rank_and_size():
    # what `mpiexec -pmi-port` does: PMI_PORT=host:port and PMI_ID, no PMI_RANK
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as lines:
            for raw in lines:
                cmd = pmi.parse(raw.rstrip(b"\n"))
                out = {"initack": "cmd=initack rc=0 rank=3 size=4 appnum=0 debug=0\n"
                                  "cmd=set size=4\ncmd=set rank=3\ncmd=set debug=0",
                       "init": "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=2",
                       "get_my_kvsname": "cmd=my_kvsname rc=0 kvsname=kvs_9",
                       "finalize": "cmd=finalize_ack rc=0"}[cmd["cmd"]]
                conn.sendall(out.encode() + b"\n")
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    ep = pmi.endpoint_from_env({"PMI_PORT": f"127.0.0.1:{port}", "PMI_ID": "3"})
    with pmi.Client(ep, timeout=5) as c:
        assert (c.rank, c.size, c.kvsname) == (3, 4, "kvs_9")
    t.join(5)
    listener.close()


@pytest.mark.parametrize("env,match", [
    ({"PMI_FD": "x"}, "PMI_FD='x' is not a file descriptor"),
    ({"PMI_FD": "999"}, "PMI_FD=999 is not open in this process"),
    ({"PMI_PORT": "nohost"}, "PMI_PORT='nohost' is not HOST:PORT"),
    ({"PMI_PORT": "h:1"}, "PMI_ID"),
])
def test_pmi_endpoint_rejects_bad_variables(env, match):
    with pytest.raises(ArgumentError, match=match):
        pmi.endpoint_from_env(env)


def test_pmi_endpoint_rejects_a_descriptor_that_is_not_a_socket(tmp_path):
    with open(tmp_path / "f", "w") as fh:
        with pytest.raises(ArgumentError, match="open in this process but not a socket"):
            pmi.endpoint_from_env({"PMI_FD": str(fh.fileno())})


# -- detect() and the rendezvous through PMI ------------------------------------------------
HYDRA_2x2 = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2",
             "PMI_HOSTNAME": "node02"}


def test_multi_host_hydra_takes_the_store_from_pmi_when_master_addr_is_missing():
    a, b = socket.socketpair()
    with a, b:
        env = {**HYDRA_2x2, "PMI_FD": str(b.fileno())}
        je = detect(env)
        assert (je.rank, je.size, je.local_rank, je.local_size) == (2, 4, 0, 2)
        assert je.pmi == pmi.Endpoint(fd=b.fileno()) and je.host_name == "node02"
        assert (je.master_addr, je.master_port, je.token, je.host_store) == \
            (None, None, b"", False)
        # a given secret is kept (rank 0 then publishes none); MASTER_ADDR alone: port via PMI
        assert detect({**env, "PYCOMM_JOB_TOKEN": "ab" * 16}).token == bytes.fromhex("ab" * 16)
        half = detect({**env, "MASTER_ADDR": "node01"})
        assert (half.master_addr, half.master_port, half.pmi is not None) == ("node01", None,
                                                                              True)
        full = detect({**env, "MASTER_ADDR": "node01", "MASTER_PORT": "29500"})
        assert (full.master_addr, full.master_port, full.pmi) == ("node01", 29501, None)
        one_host = detect({**env, "MPI_LOCALNRANKS": "4"})
        assert one_host.pmi is None and one_host.master_addr == "127.0.0.1"


@pytest.mark.parametrize("extra,why", [
    ({}, "neither PMI_FD nor PMI_PORT is set"),
    ({"PMI_FD": "999"}, "PMI_FD=999 is not open in this process")])
def test_multi_host_hydra_without_pmi_or_master_addr_says_why_and_what_to_set(extra, why):
    with pytest.raises(ArgumentError, match=rf"more than one host \(2 on this one\).*{why}.*: "
                                            r"set MASTER_ADDR.*-genv MASTER_ADDR"):
        detect({**HYDRA_2x2, **extra})


def _rendezvous_all(proxy: FakeProxy, jobs: list[JobEnv]) -> list:
    out: list = [None] * len(jobs)

    def run(i):
        try:
            out[i] = _pmi_rendezvous(jobs[i], timeout=10)
        except Exception as exc:        # noqa: BLE001 - compared by the test
            out[i] = exc
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return out


def _pmi_job(rank: int, fd: int, **kw) -> JobEnv:
    return JobEnv(rank, 2, kw.pop("addr", None), None, b"", "m", "mpiexec",
                  host_store=rank == 0, pmi=pmi.Endpoint(fd=fd), **kw)


def test_rank0_publishes_its_store_and_a_fresh_secret_through_pmi():
    proxy = FakeProxy(2)
    out = _rendezvous_all(proxy, [_pmi_job(r, proxy.fds[r], addr="127.0.0.1" if r == 0
                                           else None) for r in range(2)])
    (j0, server), (j1, none) = out
    try:
        assert none is None and server.port > 0
        assert (j0.master_addr, j0.master_port, j0.token, j0.job_id) == \
            (j1.master_addr, j1.master_port, j1.token, j1.job_id)
        assert (j1.master_addr, j1.master_port) == ("127.0.0.1", server.port)
        assert len(j1.token) == 32 and j1.pmi is None
        assert re.fullmatch(r"m[0-9a-f]{12}", j1.job_id)
        assert proxy.seen.count("finalize") == 2
    finally:
        server.close()


def test_a_rank0_without_an_address_for_other_hosts_stops_every_rank_with_its_reason(
        monkeypatch):
    # a host whose name resolves to loopback (Debian's 127.0.1.1 line, or this VM's)
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")
    monkeypatch.delenv("PYCOMM_HOST", raising=False)
    proxy = FakeProxy(2)
    out = _rendezvous_all(proxy, [_pmi_job(r, proxy.fds[r], host_name="localhost")
                                  for r in range(2)])
    assert isinstance(out[0], ArgumentError) and isinstance(out[1], ArgumentError), out
    assert "found no address of its own for the other hosts to reach its store: localhost " \
        "is 127.0.0.1, a loopback address;" in str(out[0])
    assert "set PYCOMM_HOST" in str(out[0])
    assert str(out[1]).startswith("rank 1: rank 0 (host localhost) cannot serve the job's "
                                  "rendezvous store: ArgumentError: mpiexec (Hydra): rank 0")


# -- a real Hydra mpiexec ------------------------------------------------------------------
def _hydra_mpiexec() -> str:
    """MPICH's mpiexec (Hydra), or skip saying why not."""
    return launcher("hydra", [shutil.which("mpiexec")], "HYDRA",
                    "no mpiexec on PATH (MPICH's Hydra: pip install mpich)",
                    failed="{path} --version failed: {exc}",
                    other="{path} is not MPICH's Hydra (its --version names no HYDRA)")[0]


def test_real_hydra_pmi_port_on_one_host_forms_the_world(tmp_path):
    # without PMI_RANK pycomm once saw no launcher here and made n worlds of one
    script = tmp_path / "job.py"
    script.write_text("import numpy as np, pycomm\n"
                      "c = pycomm.COMM_WORLD\n"
                      "x = np.arange(3, dtype=np.float64) * (c.rank + 1)\n"
                      "c.Allreduce(pycomm.IN_PLACE, x)\n"
                      "print(f'OK {c.rank} {c.size} {x.tolist()} {c.host_layout.local_size}'"
                      ", flush=True)\n")
    done = subprocess.run([_hydra_mpiexec(), "-pmi-port", "-n", "3", sys.executable,
                           str(script)], env=clean_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    want = str((np.arange(3, dtype=np.float64) * 6).tolist())
    # Hydra forwards each write as it comes: ranks' lines may interleave at newlines
    for r in range(3):
        assert f"OK {r} 3 {want} 3" in done.stdout, done.stdout + done.stderr
    assert done.stdout.count("OK") == 3, done.stdout


@pytest.fixture(scope="module")
def hydra_cluster():
    mpiexec = _hydra_mpiexec()
    with emulated_hosts(3, "phh") as c:
        yield c, mpiexec, c.ssh_stand_in()


def _mpiexec(hc, hosts: str, n: int, ppn: int, *genv: str, flags=(), timeout: float = 60):
    c, mpiexec, ssh = hc
    env = clean_env()
    argv = [mpiexec, "-launcher", "ssh", "-launcher-exec", ssh, "-hosts", hosts,
            "-n", str(n), "-ppn", str(ppn), *flags]
    for pair in genv:
        argv += ["-genv", *pair.split("=", 1)]
    p = c.popen(1, argv + [sys.executable, APP], cwd=str(ROOT), env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return finish(p, timeout, "mpiexec")


def _assert_nothing_left(hc) -> None:
    """No process but the host's holder in any emulated host, no /dev/shm segment."""
    hosts_left_clean(hc[0])     # (remote proxies exit just after mpiexec)


@pytest.mark.parametrize("hosts,n,ppn,hostmap,flags", [
    ("host1,host2", 4, 2, [1, 1, 2, 2], ()),
    ("host1,host2,host3", 5, 2, [1, 1, 2, 2, 3], ()),   # a host with one rank: tcp only
    # PMI_PORT + PMI_ID and no PMI_RANK: rank and size come from the proxy too
    ("host1,host2", 4, 2, [1, 1, 2, 2], ("-pmi-port",))])
def test_real_hydra_across_hosts_needs_no_master_addr(hydra_cluster, hosts, n, ppn, hostmap,
                                                      flags):
    rc, out = _mpiexec(hydra_cluster, hosts, n, ppn, flags=flags)
    assert rc == 0, out
    assert_lines(out, hostmap)
    _assert_nothing_left(hydra_cluster)


def test_real_hydra_across_hosts_with_master_addr_from_genv(hydra_cluster):
    port = str(29500 + os.getpid() % 400)
    rc, out = _mpiexec(hydra_cluster, "host1,host2", 4, 2, "MASTER_ADDR=host1",
                       f"MASTER_PORT={port}")
    assert rc == 0, out
    assert_lines(out, [1, 1, 2, 2])
    _assert_nothing_left(hydra_cluster)


def test_real_hydra_rank0_that_cannot_serve_stops_every_host_with_its_reason(hydra_cluster):
    # MASTER_PORT without MASTER_ADDR: rank 0 binds MASTER_PORT + 1, taken here on host 1
    c = hydra_cluster[0]
    port = 29000 + os.getpid() % 400
    with port_taken(c, 1, port + 1):
        t0 = time.monotonic()
        rc, out = _mpiexec(hydra_cluster, "host1,host2", 4, 2, f"MASTER_PORT={port}")
        took = time.monotonic() - t0
    assert rc != 0, out
    assert took < 20, f"the ranks waited {took:.0f} s instead of stopping"
    # every rank that got as far as the PMI barrier says why, rank 0's host named
    for r in (1, 2, 3):
        if f"rank {r}: rank 0 (host host1) cannot serve the job's rendezvous store" in out:
            break
    else:
        pytest.fail(f"no other rank named rank 0's failure:\n{out}")
    assert "Address already in use" in out, out
    _assert_nothing_left(hydra_cluster)
