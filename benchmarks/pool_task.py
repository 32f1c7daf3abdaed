"""What one ``pycomm.Pool.run`` of a no-op task costs the parent: the store round trips and
the ranks' wake-ups around a task, which the test suite pays once or more per test.

For each world size a pool is started, warmed with a few tasks, then ``--reps`` blocks of
``--tasks`` no-op tasks are timed; the mean per task of each block and the best block are
printed, in milliseconds (the best block: on a shared machine the load moves the others).

Run::

    python benchmarks/pool_task.py [--sizes 2,4,8] [--transport shm] [--tasks 50] [--reps 3]
"""

from __future__ import annotations

import argparse
import time

import pycomm


def _noop() -> None:
    return None


def main() -> None:
    """Print the per-task time of each block and the best, per world size."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2,4,8", help="comma-separated world sizes")
    ap.add_argument("--transport", default="shm")
    ap.add_argument("--tasks", type=int, default=50, help="tasks per timed block")
    ap.add_argument("--reps", type=int, default=3, help="timed blocks per size")
    args = ap.parse_args()
    for n in map(int, args.sizes.split(",")):
        with pycomm.Pool(n, transport=args.transport) as pool:
            for _ in range(5):
                pool.run(_noop)
            blocks = []
            for _ in range(args.reps):
                start = time.perf_counter()
                for _ in range(args.tasks):
                    pool.run(_noop)
                blocks.append((time.perf_counter() - start) / args.tasks * 1e3)
        shown = " ".join(f"{b:.2f}" for b in blocks)
        print(f"n={n} {args.transport}: ms per task {shown}; best {min(blocks):.2f}", flush=True)


if __name__ == "__main__":
    main()
