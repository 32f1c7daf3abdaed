"""Fast checks of the benchmark harness (benchmarks/): no rank processes but one short launch.

Size parsing, statistics, nccl-tests' bus-bandwidth factors, the validation pattern and a
deliberately wrong result being caught, the JSON/CSV schema, the overlap formula, the
listing, and one 2-rank run of osu_allreduce with -c and --json through launch.py.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import _collective
import _common
import _report

# -- sizes -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ("", [1, 2, 4, 8, 16]),
    ("4:16", [4, 8, 16]),
    ("0:4", [0, 1, 2, 4]),
    ("8", [1, 2, 4, 8]),
    ("8:", [8, 16]),
    (":2", [1, 2]),
    ("3:9", [4, 8]),
    ("1K:4K", [1024, 2048, 4096]),
])
def test_parse_sizes(text, want):
    assert _common.parse_sizes(text, 1, 16) == want


@pytest.mark.parametrize("text", ["9:3", "a:b", "-1:4"])
def test_parse_sizes_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        _common.parse_sizes(text, 1, 16)


@pytest.mark.parametrize("text, want", [("8", 8), ("4K", 4096), ("4KiB", 4096),
                                        ("16M", 16 << 20), ("1g", 1 << 30), ("0", 0)])
def test_parse_size_suffixes(text, want):
    assert _common.parse_size(text) == want


def test_explicit_sizes_win_over_range():
    args = SimpleNamespace(sizes="1M,8,4K,8", message_size="1:2")
    assert _common.sizes_from_args(args, 1, 16) == [8, 4096, 1 << 20]


def test_large_message_counts():
    args = SimpleNamespace(iterations=100, warmup=10, iter_large=5, warmup_large=1)
    assert _common.loop_counts(args, 8192) == (100, 10)
    assert _common.loop_counts(args, 8193) == (5, 1)


# -- statistics and bandwidth ------------------------------------------------------------

def test_summarize_over_ranks():
    s = _common.summarize([1.0, 2.0, 6.0], 10)
    assert (s.avg, s.min, s.max, s.iterations) == (3.0, 1.0, 6.0, 10)
    with pytest.raises(ValueError):
        _common.summarize([], 1)


@pytest.mark.parametrize("name, n, want", [
    ("allreduce", 4, 1.5), ("allreduce", 2, 1.0), ("iallreduce", 8, 1.75),
    ("reduce_scatter", 4, 0.75), ("reduce_scatter_block", 4, 0.75),
    ("allgather", 4, 0.75), ("allgatherv", 2, 0.5), ("alltoall", 4, 0.75),
    ("gather", 4, 0.75), ("scatterv", 4, 0.75),
    ("bcast", 4, 1.0), ("ibcast", 7, 1.0), ("reduce", 3, 1.0),
    ("barrier", 4, None), ("scan", 4, None),
])
def test_busbw_factors_are_nccl_tests(name, n, want):
    assert _common.busbw_factor(name, n) == want


def test_algbw_bytes_follow_nccl_tests():
    ag = _collective.Collective("allgather", "Allgather", "t", lambda c, n: None,
                                per_rank=True)
    rs = _collective.Collective("reduce_scatter", "R", "t", lambda c, n: None, divide=True)
    assert ag.algbw_bytes(1024, 4) == 4096 and ag.count(1024, 4, 4) == 256
    assert rs.algbw_bytes(1024, 4) == 1024 and rs.count(1024, 4, 4) == 64


@pytest.mark.parametrize("overall, compute, pure, want", [
    (10.0, 10.0, 10.0, 100.0),   # communication entirely hidden
    (20.0, 10.0, 10.0, 0.0),     # none hidden
    (15.0, 10.0, 10.0, 50.0),
    (30.0, 10.0, 10.0, 0.0),     # worse than serial: clipped
])
def test_overlap_formula_is_osus(overall, compute, pure, want):
    assert _collective.overlap_percent(overall, compute, pure) == pytest.approx(want)


# -- validation --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "uint8", "complex64"])
def test_pattern_sums_are_exact(dtype):
    p = _common.Pattern(dtype)
    total = p.total(range(16), 3, 100)
    want = sum(((np.arange(100) + 3 * k + 3) % 7 + 1) for k in range(16)).astype(dtype)
    assert np.array_equal(total, want)
    assert not np.array_equal(p.data(0, 0, 100), p.data(0, 1, 100))


def _fake_ctx(comm) -> _collective.Ctx:
    c = _common.Comm(SimpleNamespace(SUM="sum", Wtime=lambda: 0.0), comm, "fake", "fake")
    return _collective.Ctx(c, np.dtype("float32"), _common.Pattern("float32"))


class _OneRank:
    """A 1-rank communicator whose Allreduce can be made wrong on purpose."""

    rank, size = 0, 1

    def __init__(self, wrong: bool):
        self.wrong = wrong

    def Allreduce(self, send, recv, op=None):
        recv[...] = send
        if self.wrong:
            recv[len(recv) // 2] += 1

    def Barrier(self):
        pass


@pytest.mark.parametrize("wrong", [False, True])
def test_validation_catches_a_wrong_allreduce(wrong):
    import osu_allreduce

    comm = _OneRank(wrong)
    ctx = _fake_ctx(comm)
    case = osu_allreduce.setup(ctx, 64)
    errors = _collective._Errors()
    call = lambda: comm.Allreduce(*case.args, **case.kwargs)
    _collective._blocking(ctx.c, case, call, 5, 0, True, errors, barrier=True)
    assert errors.count == (5 if wrong else 0)
    if wrong:
        assert "recvbuf: 1 of 64 elements wrong, first at 32" in errors.items[0]


def test_validation_catches_a_stale_buffer():
    """A collective that does nothing leaves the spoiled output: caught."""
    import osu_bcast

    ctx = _fake_ctx(_OneRank(False))
    case = osu_bcast.setup(ctx, 8)
    case.fill(0)
    assert case.check(0) is None            # the root already holds its data
    assert case.check(1) is not None         # but not iteration 1's


def test_mismatch_messages():
    assert _common.mismatch(np.arange(4), np.arange(4), "x") is None
    assert "2 elements, expected 3" in _common.mismatch(np.arange(2), np.arange(3), "x")


# -- JSON and CSV --------------------------------------------------------------------------

def test_json_and_csv_schema(tmp_path):
    meta = _common.run_metadata(None, "osu_test", algorithm="ring", dtype="float32", op="SUM")
    r = _report.Report("OSU MPI Test", "lib", [("size", "Size", 10, "d"),
                                               ("avg_us", "Avg Latency(us)", 17, ".2f")],
                       meta=meta)
    r.row(8, 1.5, iterations=10)
    r.record(size=16, avg_us=2.5, algorithm="auto", auto_choice="ring")
    r.write(str(tmp_path / "r.json"), str(tmp_path / "r.csv"))
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["schema"] == _report.SCHEMA
    for key in _report.META_KEYS:
        assert key in doc["meta"], key
    assert doc["meta"]["algorithm"] == "ring" and doc["meta"]["op"] == "SUM"
    assert {"nproc", "loadavg", "date", "host"} <= set(doc["machine"])
    assert doc["rows"][0] == {"size": 8, "avg_us": 1.5, "iterations": 10}
    assert doc["columns"][:2] == ["size", "avg_us"]
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert [row["size"] for row in rows] == ["8", "16"]
    assert [row["algorithm"] for row in rows] == ["ring", "auto"]
    assert rows[0]["world_size"] == "1" and rows[0]["op"] == "SUM"
    assert list(rows[0])[:len(_report.META_KEYS)] == list(_report.META_KEYS)


def test_report_prints_osu_header(capsys):
    r = _report.Report("OSU MPI Allreduce Latency Test", "pycomm 0.1.0, transport shm",
                       [("size", "Size", 10, "d"), ("avg_us", "Avg Latency(us)", 17, ".2f")])
    r.header("2 ranks")
    r.row(8, 3.14159)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# OSU MPI Allreduce Latency Test (pycomm 0.1.0, transport shm)"
    assert out[2].startswith("# Size") and out[2].endswith("Avg Latency(us)")
    assert out[3].split() == ["8", "3.14"]


# -- entry points --------------------------------------------------------------------------

def test_list_names_every_script():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--list"], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for name in ("osu_latency", "osu_bibw", "osu_multi_lat", "osu_reduce_scatter",
                 "osu_alltoallv", "osu_scan", "osu_iallreduce", "osu_ibarrier", "reference"):
        assert name + ".py" in proc.stdout
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ")}
    assert listed == {p.name for p in (ROOT / "benchmarks").glob("osu_*.py")} | \
        {"reference.py"}


def test_compare_turns_rows_into_lines():
    import compare

    doc = {"meta": {"world_size": 2}, "rows": [
        {"size": 8, "algorithm": "ring", "avg_us": 2.0, "algbw_gbps": 0.004},
        {"size": 8, "algorithm": "auto", "avg_us": 1.0, "algbw_gbps": 0.008},
        {"size": 16, "algorithm": "ring", "error": "cannot"}]}
    lines = compare.lines_from(doc, "allreduce", "pycomm shm")
    assert lines == {"pycomm shm ring": {8: {"us": 2.0, "mbps": 4.0}},
                     "pycomm shm auto": {8: {"us": 1.0, "mbps": 8.0}}}
    bw = compare.lines_from({"rows": [{"size": 1000, "bandwidth_mbps": 500.0}]}, "bw", "MPI")
    assert bw == {"MPI": {1000: {"us": 2.0, "mbps": 500.0}}}


def test_reference_shm_ping_pong_moves_the_bytes_and_stops():
    import reference

    pp = reference.ShmPingPong(64)
    try:
        assert pp.run(16, 50) > 0
        assert (pp._area(1)[:16] == 1).all()      # the child copied the ping into the pong
        assert pp.seq == 50
    finally:
        pp.close()
    assert pp.child.exitcode == 0


def test_compare_adds_the_python_shm_floor_to_latency_only():
    import compare

    doc = {"rows": [{"size": 8, "memcpy_gbps": 1.0, "tcp_latency_us": 20.0,
                     "tcp_stream_mbps": 4.0, "shm_latency_us": 2.0}]}
    assert compare.ceiling_lines(doc, "latency")["python shm"] == {8: {"us": 2.0,
                                                                      "mbps": 4.0}}
    assert "python shm" not in compare.ceiling_lines(doc, "allreduce")


def test_compare_rejects_a_run_with_the_wrong_world_size(tmp_path, monkeypatch, capsys):
    # mpiexec of one MPI with an mpi4py built on another starts n singletons: each times a
    # 1-rank collective, and must not become the reference
    import compare

    def fake_runs(bench, n, size_args, extra, transports, algorithms, mpi, ceiling, out):
        runs = []
        for label, kind, ranks in (("pycomm shm", "pycomm", n), ("MPI", "mpi", 1)):
            path = tmp_path / f"{kind}.json"
            path.write_text(json.dumps({"meta": {"world_size": ranks}, "rows": [
                {"size": 8, "algorithm": "auto" if kind == "pycomm" else "default",
                 "avg_us": 10.0 if kind == "pycomm" else 1.0, "algbw_gbps": 0.001}]}))
            runs.append({"label": label, "kind": kind, "json": str(path),
                         "argv": [sys.executable, "-c", "pass"]})
        return runs

    monkeypatch.setattr(compare, "_runs", fake_runs)
    monkeypatch.setattr(compare, "_mpi_available", lambda: True)
    assert compare.main(["allreduce", "-n", "4", "--auto-only", "--no-ceiling",
                         "--out", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "REJECTED: MPI ran as 1 rank(s), not 4" in out.err
    doc = json.loads((tmp_path / "allreduce-n4.json").read_text())
    assert set(doc["lines"]) == {"pycomm shm auto"}
    assert [r.get("rejected") for r in doc["runs"]] == [None, "ran as 1 rank(s), not 4"]


def test_short_launch_validates_and_writes_json(tmp_path):
    out = tmp_path / "ar.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), "-n", "2", str(ROOT / "benchmarks" /
         "osu_allreduce.py"), "--sizes", "8,4K", "-i", "3", "-x", "1", "-c", "-f", "-q",
         "--json", str(out)], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "VALIDATION FAILED" not in proc.stderr
    assert "# OSU MPI Allreduce Latency Test (pycomm" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["meta"]["world_size"] == 2 and doc["meta"]["validate"] is True
    assert [r["size"] for r in doc["rows"]] == [8, 4096]
    assert all(r["iterations"] == 3 and r["busbw_gbps"] > 0 for r in doc["rows"])


def test_better_keeps_the_lower_average():
    _better = _collective._better
    a, b = {"stats": _common.summarize([2.0], 1)}, {"stats": _common.summarize([1.0], 1)}
    assert _better(None, a) is a and _better(a, b) is b and _better(b, a) is b
    err = {"error": "cannot"}
    assert _better(err, a) is a and _better(a, err) is a and _better(None, None) is None


def test_algorithm_sweep_with_rounds(tmp_path):
    out = tmp_path / "bcast.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), "-n", "3", str(ROOT / "benchmarks" /
         "osu_bcast.py"), "--algorithm", "all", "--rounds", "2", "--sizes", "8,128K", "-i",
         "2", "-x", "1", "-c", "-q", "--json", str(out)], check=False, cwd=ROOT,
        capture_output=True, text=True, timeout=120,
        # 128 KiB: past the slots; no direct reads, whatever the cores (a message algorithm)
        env={**os.environ, "PYCOMM_SHM_DIRECT_BYTES": "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["meta"]["rounds"] == 2
    import pycomm
    names = {*pycomm.algorithms("bcast"), "auto"}     # every registered one, hierarchical too
    for size in (8, 131072):
        rows = {r["algorithm"]: r for r in doc["rows"] if r["size"] == size}
        assert set(rows) == names and all(r["avg_us"] > 0 for r in rows.values())
        # 8 B on one host's shared memory goes through the slots (pycomm.shmcoll)
        assert rows["auto"]["auto_choice"] == "shared_slots" if size == 8 else \
            rows["auto"]["auto_choice"] in names - {"auto"}


# -- sweep_report ----------------------------------------------------------------------------

def _sweep_doc(tmp_path, name: str, rows: list[dict]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"benchmark": "osu_allgather", "rows": rows,
                                "meta": {"world_size": 2, "cpu_count": 2}}))
    return str(path)


def test_sweep_report_compares_the_model_choice_with_the_best_launch(tmp_path):
    from benchmarks import sweep_report
    from pycomm.collectives import choose

    picked = choose("allgather", 2 * 64, 2, requested="auto")[0]
    other = next(a for a in ("ring", "recursive_doubling") if a != picked)
    a = _sweep_doc(tmp_path, "a.json", [
        {"size": 64, "algorithm": picked, "avg_us": 30.0},
        {"size": 64, "algorithm": other, "avg_us": 20.0},
        {"size": 64, "algorithm": "auto", "avg_us": 1.0},          # not an algorithm
        {"size": 64, "algorithm": "bruck", "error": "cannot serve"}])
    b = _sweep_doc(tmp_path, "b.json", [
        {"size": 64, "algorithm": picked, "avg_us": 21.0},         # its better launch
        {"size": 64, "algorithm": other, "avg_us": 25.0}])
    runs = sweep_report.load([a, b])
    lines, hits, total = sweep_report.table(runs, 1.10)
    assert (hits, total) == (1, 1) and lines[-1] == "| allgather | 2 | 1.05 | 1/1 |"
    lines, hits, _ = sweep_report.table(runs, 1.01)
    assert hits == 0 and f"1.05 ({other})" in lines[-1]
    notes = sweep_report.noise(runs)
    assert "median 1.34, max 1.43" in notes[0]             # 30/21 and 25/20
    assert "64 B 1.50/1.19" in notes[1]                    # the identical-schedule control


def test_sweep_report_judges_a_run_by_its_transports_constants(tmp_path, monkeypatch):
    from benchmarks import sweep_report
    from pycomm.collectives import choose

    assert [sweep_report.model_transport(t) for t in (None, "shm", "shm+tcp", "rdma")] == \
        ["shm", "shm", "tcp", "rdma"]
    # a table whose rdma row makes a message 1000x dearer: the choices differ by transport
    table = tmp_path / "t.json"
    shm = {"alpha": 1e-6, "beta": 1e-10, "gamma": 1e-10, "sigma": 0.0}
    table.write_text(json.dumps({"shm": shm, "rdma": {**shm, "alpha": 1e-3, "beta": 1e-13}}))
    monkeypatch.setenv("PYCOMM_TUNE_FILE", str(table))
    size = 1 << 20
    picks = {t: choose("allreduce", size, 4, requested="auto", transport=t)[0]
             for t in ("shm", "rdma")}
    assert picks["shm"] != picks["rdma"]
    rows = [{"size": size, "algorithm": a, "avg_us": 10.0 if a == picks["rdma"] else 20.0}
            for a in set(picks.values())]
    path = tmp_path / "rdma.json"
    path.write_text(json.dumps({"benchmark": "osu_allreduce", "rows": rows, "meta": {
        "world_size": 4, "cpu_count": 4, "transport": "rdma"}}))
    lines, hits, total = sweep_report.table(sweep_report.load([str(path)]), 1.10)
    assert (hits, total) == (1, 1) and lines[-1] == "| allreduce (rdma) | 4 | 1.00 | 1/1 |"


def test_p2p_exchange_times_its_four_patterns_on_pycomm():
    # the script is an mpi4py program: the same file runs under mpiexec for the reference
    proc = subprocess.run([sys.executable, str(ROOT / "launch.py"), "--mpi4py", "-n", "3",
                           str(ROOT / "benchmarks" / "p2p_exchange.py"), "-i", "50", "-x",
                           "5", "--passes", "2", "--size", "64"], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert [" ".join(r[:-2]) for r in rows] == [
        f"pass {p} {name}" for p in (1, 2)
        for name in ("ping-pong round trip", "Sendrecv", "Irecv+Isend+Waitall",
                     "halo 2 Irecv+2 Isend")], proc.stdout
    assert all(r[-1] == "us" and float(r[-2]) > 0 for r in rows), proc.stdout


def test_comm_churn_times_an_allreduce_after_many_communicators():
    # an mpi4py program too: after 70 communicators created and freed (more than the
    # shared-memory area's 64 blocks), the fresh one's calls still go through its slots
    proc = subprocess.run([sys.executable, str(ROOT / "launch.py"), "--mpi4py", "-n", "2",
                           str(ROOT / "benchmarks" / "comm_churn.py"), "--churn", "70",
                           "-i", "50", "-x", "5", "--passes", "2"], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[:6] for line in lines[:2]] == [
        ["pass", str(p), "after", "70", "communicators", "Allreduce"] for p in (1, 2)], lines
    assert all(float(line.split()[-2]) > 0 for line in lines[:2]), lines
    assert lines[2].startswith("churn: ") and lines[2].endswith(" us per Dup+Allreduce+Free")

