"""How close the automatic algorithm choice comes to the best measured algorithm.

Reads the JSON of ``--algorithm all`` sweeps (``osu_allreduce``, ``osu_bcast``, ...), one
file per launch, keeps for every (size, algorithm) the best average over the launches of
the same (benchmark, world size), and prints a Markdown table: per size, the measured time
of the algorithm :func:`pycomm.collectives.choose` picks now (with the shipped or
``PYCOMM_TUNE_FILE`` constants of the sweep's transport, at the sweep's ranks per core:
world size over its ``cpu_count``) over the best algorithm's, naming the best where the
ratio passes ``--within``. Then the noise that bounds any such judgement: per (size,
algorithm) measured in several launches, max/min over them; and on 2 ranks, allgather's
``ring`` against ``recursive_doubling``, which send the very same message.

Run::

    python -m benchmarks.sweep_report results/sweep/*-sweep-*.json [--within 1.10]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

from pycomm.collectives import choose
from pycomm.tuning.cost import model_transport  # a run's meta.transport -> its table

__all__ = ["load", "model_transport", "table", "noise", "main"]


def load(paths: list[str]) -> dict:
    """``{(benchmark, ranks, cores, transport): {size: {algorithm: [avg_us per launch]}}}``,
    the transport as :func:`model_transport` names it."""
    runs: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        meta = doc["meta"]
        key = (doc["benchmark"].removeprefix("osu_"), int(meta["world_size"]),
               int(meta["cpu_count"]), model_transport(meta.get("transport")))
        for row in doc["rows"]:
            if "avg_us" in row and row["algorithm"] != "auto":
                runs[key][row["size"]][row["algorithm"]].append(row["avg_us"])
    return runs


def _label(size: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def table(runs: dict, within: float) -> tuple[list[str], int, int]:
    """Markdown rows, the points within ``within`` of the best, and all points."""
    sizes = sorted({s for per_size in runs.values() for s in per_size})
    lines = ["| collective | ranks | " + " | ".join(map(_label, sizes))
             + f" | within {round((within - 1) * 100)}% |", "|---|---|" + "---|" * (len(sizes) + 1)]
    hits = total = 0
    for (coll, n, cores, transport), per_size in sorted(runs.items()):
        cells = []
        for s in sizes:
            times = {a: min(v) for a, v in per_size.get(s, {}).items()}
            if not times:
                cells.append("")
                continue
            best = min(times, key=times.get)
            nbytes = s * n if coll == "allgather" else s   # the model's bytes of the call
            picked = choose(coll, nbytes, n, requested="auto", transport=transport,
                            oversubscription=max(1.0, n / cores))[0]
            ratio = times[picked] / times[best]
            cells.append(f"{ratio:.2f}" if ratio <= within else f"{ratio:.2f} ({best})")
        row_hits = sum(1 for c in cells if c and "(" not in c)
        hits, total = hits + row_hits, total + sum(1 for c in cells if c)
        label = coll if transport == "shm" else f"{coll} ({transport})"
        lines.append(f"| {label} | {n} | " + " | ".join(cells)
                     + f" | {row_hits}/{len([c for c in cells if c])} |")
    return lines, hits, total


def noise(runs: dict) -> list[str]:
    """Lines describing launch-to-launch spread and the identical-schedule control."""
    out = []
    for (coll, n, _, _), per_size in sorted(runs.items()):
        spread = [max(v) / min(v) for algs in per_size.values() for v in algs.values()
                  if len(v) > 1]
        if spread:
            out.append(f"{coll}, {n} ranks: launch-to-launch max/min of one (size, "
                       f"algorithm): median {statistics.median(spread):.2f}, "
                       f"max {max(spread):.2f}")
    same = next((v for (c, n, _, _), v in runs.items() if (c, n) == ("allgather", 2)), {})
    pairs = [(s, [max(a, b) / min(a, b) for a, b in zip(v["ring"], v["recursive_doubling"])])
             for s, v in sorted(same.items()) if "ring" in v and "recursive_doubling" in v]
    if pairs:
        out.append("allgather, 2 ranks, ring vs recursive_doubling (the same message), per "
                   "launch: " + "; ".join(f"{_label(s)} " + "/".join(f"{r:.2f}" for r in rs)
                                          for s, rs in pairs))
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.sweep_report",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="+", help="--json files of --algorithm all sweeps")
    p.add_argument("--within", type=float, default=1.10,
                   help="a choice counts as good within this factor of the best (1.10)")
    args = p.parse_args(argv)
    runs = load(args.json)
    lines, hits, total = table(runs, args.within)
    print("\n".join(lines))
    print(f"\n{hits} of {total} points within {args.within:g}x of the best algorithm")
    for line in noise(runs):
        print(f"- {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
