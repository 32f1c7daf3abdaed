"""A/B of two pycomm revisions on one small collective, alternating runs in one session.

What a change costs on the small-message path is a fraction of a microsecond, far below
the spread between runs on a shared machine; only a paired comparison sees it. Each pair
runs the same ``launch.py -n N`` job once on each revision (the order alternates), every
job times ``--blocks`` blocks of ``--iters`` calls after a warm-up, and the pair's
difference is taken between the two jobs' best blocks (the least disturbed) and between
their median blocks. The table gives every pair; the summary the median difference and
its interquartile range, in microseconds and in percent of the base.

Run::

    python -m benchmarks.ab --base 937b771 --head 190420e --pairs 11
    python -m benchmarks.ab --base HEAD~3 --coll Bcast --bytes 4096 -n 4

``--head`` defaults to the working tree as it is (uncommitted changes included). Each
revision is checked out with ``git worktree add --detach`` into a temporary folder that
is removed at exit; ``--base-tree DIR`` names a base already unpacked instead (a machine
without the repository's history: ``git archive REV | tar -x -C DIR`` where it is).
``--coll Latency`` times a Send/Recv ping-pong between ranks 0 and 1 (half the round
trip, as ``osu_latency``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RANK = Path(__file__).resolve().parent / "_ab_rank.py"


def _checkout(rev: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(into),
                    rev], check=True)
    return into


def _run(tree: Path, n: int, spec: dict, timeout: float) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, str(tree / "launch.py"), "-n", str(n), str(RANK),
                          json.dumps(spec)], cwd=tree, env=env, capture_output=True,
                         text=True, timeout=timeout)
    for line in out.stdout.splitlines():
        if "AB " in line:
            fields = line.split("AB ", 1)[1].split()
            if not fields[0].startswith(str(tree)):
                raise RuntimeError(f"the job imported {fields[0]}, not the tree {tree}")
            return [float(x) for x in fields[1:]]
    raise RuntimeError(f"no result from {tree} (exit {out.returncode}):\n{out.stderr[-2000:]}")


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    side_a = p.add_mutually_exclusive_group(required=True)
    side_a.add_argument("--base", help="git revision of side A")
    side_a.add_argument("--base-tree", type=Path, help="an unpacked tree as side A")
    p.add_argument("--head", help="git revision of side B (default: the working tree)")
    p.add_argument("-n", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--coll", default="Allreduce",
                   choices=["Allreduce", "Bcast", "Barrier", "Allgather", "Latency"])
    p.add_argument("--bytes", type=int, default=8, help="message size (float32 values)")
    p.add_argument("--pairs", type=int, default=11)
    p.add_argument("--iters", type=int, default=5000, help="calls per block")
    p.add_argument("--blocks", type=int, default=7)
    p.add_argument("--warmup", type=int, default=3000)
    args = p.parse_args(argv)
    spec = {"coll": args.coll, "bytes": args.bytes, "iters": args.iters,
            "blocks": args.blocks, "warmup": args.warmup}
    with tempfile.TemporaryDirectory(prefix="pycomm-ab-") as tmp:
        trees = [args.base_tree.resolve() if args.base_tree else
                 _checkout(args.base, Path(tmp) / "a")]
        try:
            trees.append(_checkout(args.head, Path(tmp) / "b") if args.head else ROOT)
            names = [args.base or str(args.base_tree), args.head or "working tree"]
            print(f"{args.coll} {args.bytes} B, {args.n} ranks, {args.pairs} pairs of "
                  f"{args.blocks} blocks x {args.iters} calls; us per call")
            print("pair  order  A best  B best  B-A best   A med   B med  B-A med")
            best_d, med_d, base_best = [], [], []
            for i in range(args.pairs):
                order = (0, 1) if i % 2 == 0 else (1, 0)
                res = {}
                for side in order:
                    res[side] = _run(trees[side], args.n, spec, 600)
                a, b = res[0], res[1]
                best_d.append(min(b) - min(a))
                med_d.append(statistics.median(b) - statistics.median(a))
                base_best.append(min(a))
                print(f"{i:4d}  {'AB' if order == (0, 1) else 'BA'}  {min(a):7.2f} "
                      f"{min(b):7.2f}  {best_d[-1]:+8.2f} {statistics.median(a):7.2f} "
                      f"{statistics.median(b):7.2f} {med_d[-1]:+8.2f}", flush=True)
            ref = statistics.median(base_best)
            for label, d in (("best blocks", best_d), ("median blocks", med_d)):
                q1, mid, q3 = _quartiles(d)
                print(f"B-A ({label}): median {mid:+.2f} us ({100 * mid / ref:+.1f}% of "
                      f"A's {ref:.2f} us), IQR {q1:+.2f} .. {q3:+.2f} us")
            print(f"A = {names[0]}, B = {names[1]}")
        finally:
            for i, t in enumerate(trees):     # the worktrees this run added
                if t != ROOT and not (i == 0 and args.base_tree):
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(t)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
