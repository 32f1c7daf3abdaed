"""pycomm.MPI ``Allreduce`` with a user op on ``MPI.DOUBLE.Create_contiguous(2)``, and with
the built-in ``MPI.SUM`` on the same type, on several pycomm revisions alternated.

A user op on a derived datatype of several basic elements must get whole items: pycomm.MPI
hands the Communicator its buffers viewed as one item per datatype item, so that the
schedules split them only between items. What that view costs shows at large counts, far
above the spread between runs on a shared machine only when the sides are alternated:
each round runs one ``launch.py -n N`` job per revision (the order rotates from round to
round), every job times every case (``--iters`` calls after a warm-up, the mean per call
on rank 0), and the table gives, per case and revision, the median and the min-max range
of the rounds' figures in milliseconds. The user op is ``inoutbuf += inbuf`` written
elementwise, so its answer does not depend on where a buffer is split; the ``parts``
column says whether some call handed it a partial item (an odd number of doubles) in any
round: a revision that splits items runs, and its time counts, but it is wrong for an op
that reads whole items.

Run::

    python -m benchmarks.userop_items                  # dfb9982^, dfb9982, working tree
    python -m benchmarks.userop_items --side base=/tmp/userop_base --side head=. -n 2 4

``--side LABEL=REV`` checks a git revision out with ``git worktree add --detach`` into a
temporary folder removed at exit; ``--side LABEL=DIR`` uses an unpacked tree as it is
(``.`` the working tree). The job of a side runs that tree's ``launch.py`` with
``PYTHONPATH`` set to the tree, and must import that tree's pycomm (checked).

A job alone (what the driver starts on each side)::

    python launch.py -n 2 benchmarks/userop_items.py --rank '{"items": [1024], "iters": [50]}'
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve()
ITEMS = (1 << 10, 1 << 16, 1 << 20)
# calls timed per case: about the same seconds per case at each size
ITERS = {1 << 10: 200, 1 << 16: 30, 1 << 20: 6}
DEFAULT_SIDES = ("dfb9982^=dfb9982^", "dfb9982=dfb9982", "head=.")


# -- one job (on the ranks) ----------------------------------------------------------------

def rank_main(spec: dict) -> int:
    """Time every (items, op) case of ``spec`` on this job's ranks; rank 0 prints one line
    ``UOP <pycomm file> <json of {case: ms per call}, "parts": bool>``."""
    import numpy as np

    import pycomm
    from pycomm import MPI

    comm = MPI.COMM_WORLD
    pair = MPI.DOUBLE.Create_contiguous(2).Commit()
    parts = [False]

    def add(inbuf, inoutbuf, datatype):
        if inoutbuf.size % 2:
            parts[0] = True
        np.add(inbuf, inoutbuf, out=inoutbuf)

    user = MPI.Op.Create(add, commute=True)
    out = {}
    for m, iters in zip(spec["items"], spec["iters"]):
        send = np.arange(2 * m, dtype=np.float64) + comm.rank
        recv = np.empty_like(send)
        want = comm.size * np.arange(2 * m, dtype=np.float64) + \
            comm.size * (comm.size - 1) / 2
        for name, op in (("user", user), ("SUM", MPI.SUM)):
            for _ in range(spec.get("warmup", 2)):
                comm.Allreduce([send, m, pair], [recv, m, pair], op)
            if not np.array_equal(recv, want):
                raise SystemExit(f"rank {comm.rank}: {name} at {m} items: wrong result")
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(iters):
                comm.Allreduce([send, m, pair], [recv, m, pair], op)
            out[f"{m} {name}"] = (time.perf_counter() - t) / iters * 1e3
    seen = comm.allreduce(parts[0], op=MPI.LOR)
    user.Free()
    pair.Free()
    if comm.rank == 0:
        out["parts"] = bool(seen)
        print("UOP", pycomm.__file__, json.dumps(out), flush=True)
    return 0


# -- the driver ----------------------------------------------------------------------------

def _tree(value: str, tmp: Path, label: str) -> tuple[Path, bool]:
    """(tree, added): a folder as it is, or a git revision checked out into ``tmp``."""
    if value == ".":
        return ROOT, False
    if Path(value).is_dir():
        return Path(value).resolve(), False
    into = tmp / f"side{abs(hash(label))}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(into),
                    value], check=True)
    return into, True


def _job(tree: Path, n: int, spec: dict, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, str(tree / "launch.py"), "-n", str(n), str(HERE),
                          "--rank", json.dumps(spec)], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=timeout)
    for line in out.stdout.splitlines():
        if "UOP " in line:
            path, blob = line.split("UOP ", 1)[1].split(" ", 1)
            if not path.startswith(str(tree)):
                raise RuntimeError(f"the job imported {path}, not the tree {tree}")
            return json.loads(blob)
    raise RuntimeError(f"no result from {tree} (exit {out.returncode}):\n"
                       f"{out.stdout[-1500:]}\n{out.stderr[-1500:]}")


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the rounds, print the table; return the exit status."""
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--rank"]:
        return rank_main(json.loads(argv[1]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", action="append", metavar="LABEL=REV|DIR",
                   help="a revision or tree to time (repeat; default: "
                   + ", ".join(DEFAULT_SIDES) + ")")
    p.add_argument("-n", type=int, nargs="+", default=[2, 4], help="ranks (default 2 4)")
    p.add_argument("--items", type=int, nargs="+", default=list(ITEMS),
                   help="items of the pair type per call")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    args = p.parse_args(argv)
    spec = {"items": args.items, "iters": [ITERS.get(m, max(3, (1 << 16) * 30 // m))
                                           for m in args.items]}
    sides = [s.split("=", 1) for s in (args.side or DEFAULT_SIDES)]
    with tempfile.TemporaryDirectory(prefix="pycomm-userop-") as tmp:
        trees, added = [], []
        try:
            for label, value in sides:
                tree, new = _tree(value, Path(tmp), label)
                trees.append(tree)
                if new:
                    added.append(tree)
            res: dict = {}      # (n, label) -> list of per-round results
            for n in args.n:
                for i in range(args.rounds):
                    order = [(i + k) % len(sides) for k in range(len(sides))]
                    for s in order:
                        got = _job(trees[s], n, spec, args.timeout)
                        res.setdefault((n, sides[s][0]), []).append(got)
                        print(f"n={n} round {i} {sides[s][0]}: " + " ".join(
                            f"{k}={v:.3f}" for k, v in got.items() if k != "parts"),
                            file=sys.stderr, flush=True)
            _table(res, args.n, args.items, [s[0] for s in sides], args.rounds)
        finally:
            for tree in added:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(tree)], check=False)
    return 0


def _table(res: dict, ns: list, items: list, labels: list, rounds: int) -> None:
    print(f"Allreduce on MPI.DOUBLE.Create_contiguous(2); ms per call, median (min-max) of "
          f"{rounds} alternated rounds")
    width = max(len(x) for x in labels)
    print(f"{'ranks':>5} {'items':>8} {'op':>4}  " + "  ".join(
        f"{lab:>{max(width, 22)}}" for lab in labels))
    for n in ns:
        for m in items:
            for op in ("user", "SUM"):
                cells = []
                for lab in labels:
                    xs = [r[f"{m} {op}"] for r in res[(n, lab)]]
                    cells.append(f"{statistics.median(xs):8.3f} ({min(xs):.3f}-{max(xs):.3f})"
                                 .rjust(max(width, 22)))
                print(f"{n:>5} {m:>8} {op:>4}  " + "  ".join(cells))
    print("parts (a user op call got a partial item): " + ", ".join(
        f"{lab}: {'yes' if any(r['parts'] for n in ns for r in res[(n, lab)]) else 'no'}"
        for lab in labels))


if __name__ == "__main__":
    sys.exit(main())
