"""Collectives inside a cgroup with a CPU quota (a container's ``--cpus``, a pod's CPU limit).

Run (root; a writable cgroup cpu controller, v1 or v2)::

    python -m benchmarks.cpu_quota [--cpus 1] [-n 2] [--passes 3] [--base-tree DIR]

Each pass runs ``osu_allreduce`` (8 B and 4 KiB) on ``-n`` ranks inside one new cgroup
whose quota is ``--cpus`` CPUs per 100 ms period: pycomm as this tree is, pycomm from
``--base-tree`` (another revision, ``git worktree add DIR REV``) when given, and mpi4py +
MPICH (``mpiexec``, when importable), in that order, alternating nothing else. Besides the
times it prints, per run, how many periods the group was throttled in and for how long
(``cpu.stat``): the kernel stops every process of the group once the quota is spent.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "osu_allreduce.py"


def _controller() -> tuple[Path, str]:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if tail and tail[0] == "cgroup" and "cpu" in tail[2].split(",") and fields[3] == "/":
            return Path(fields[4]), "v1"
        if tail and tail[0] == "cgroup2" and fields[3] == "/" and "cpu" in \
                (Path(fields[4]) / "cgroup.subtree_control").read_text().split():
            return Path(fields[4]), "v2"
    sys.exit("no writable cgroup cpu controller (v1 'cpu' or v2 with cpu enabled)")


def _stat(group: Path) -> dict[str, int]:
    out = {}
    for line in (group / "cpu.stat").read_text().splitlines():
        key, value = line.split()
        out[key] = int(value)
    return out


def _run(group: Path, argv: list[str], env: dict, out: Path) -> dict:
    before = _stat(group)
    script = f'echo $$ > {group}/cgroup.procs && exec "$@"'
    proc = subprocess.run(["sh", "-c", script, "sh", *argv, "--sizes", "8,4K", "-i", "3000",
                           "-x", "300", "-q", "--json", str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    after = _stat(group)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{argv[:3]} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    rows = json.loads(out.read_text())["rows"]
    # v1 counts throttled time in ns, v2 in µs (throttled_usec)
    throttled_ms = (after.get("throttled_time", 0) - before.get("throttled_time", 0)) / 1e6 \
        + (after.get("throttled_usec", 0) - before.get("throttled_usec", 0)) / 1e3
    return {"us": {str(r["size"]): r["avg_us"] for r in rows},
            "throttled": after["nr_throttled"] - before["nr_throttled"],
            "periods": after["nr_periods"] - before["nr_periods"],
            "throttled_ms": throttled_ms}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpus", type=float, default=1.0, help="quota in CPUs (default 1)")
    ap.add_argument("-n", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--base-tree", help="another pycomm tree to run beside this one")
    ap.add_argument("--json", help="write every run here")
    args = ap.parse_args()
    top, kind = _controller()
    group = top / f"pycomm-quota-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        period = 100000
        quota = int(args.cpus * period)
        if kind == "v1":
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (group / "cpu.max").write_text(f"{quota} {period}")
        sides = {"pycomm": ROOT}
        if args.base_tree:
            sides["pycomm base"] = Path(args.base_tree).resolve()
        have_mpi = shutil.which("mpiexec") is not None
        runs: dict[str, list[dict]] = {name: [] for name in [*sides, "MPICH"][:len(sides)
                                                                               + have_mpi]}
        with tempfile.TemporaryDirectory() as tmp:
            for p in range(args.passes):
                for name, tree in sides.items():
                    env = dict(os.environ, PYTHONPATH=str(tree))
                    runs[name].append(_run(group, [sys.executable, str(tree / "launch.py"),
                                                   "-n", str(args.n),
                                                   str(tree / "benchmarks/osu_allreduce.py")],
                                           env, Path(tmp) / f"{name}-{p}.json"))
                if have_mpi:
                    runs["MPICH"].append(_run(group, ["mpiexec", "-n", str(args.n),
                                                      sys.executable, str(SCRIPT),
                                                      "--mpi4py"],
                                              dict(os.environ), Path(tmp) / f"mpi-{p}.json"))
    finally:
        group.rmdir()
    print(f"allreduce, {args.n} ranks, a cgroup of {args.cpus:g} CPU quota ({kind}), "
          f"{args.passes} passes: µs per call (each pass), throttled periods / periods")
    print("| side | 8 B | 4 KiB | throttled | throttled ms |")
    print("|---|---|---|---|---|")
    for name, rs in runs.items():
        cells = [" ".join(f"{r['us'][s]:.3g}" for r in rs) for s in ("8", "4096")]
        thr = " ".join(f"{r['throttled']}/{r['periods']}" for r in rs)
        ms = " ".join(f"{r['throttled_ms']:.0f}" for r in rs)
        print(f"| {name} | {cells[0]} | {cells[1]} | {thr} | {ms} |")
        med = statistics.median(r["us"]["8"] for r in rs)
        print(f"|   median 8 B | {med:.3g} | | | |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
