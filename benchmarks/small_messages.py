"""Print the small-message table from the two passes of ``benchmarks/small_messages.sh``.

``python benchmarks/small_messages.py OUTDIR``: one markdown row per benchmark and size,
pycomm's and MPI's µs per call in pass A / pass B, and the range of their ratio; for the
latency rows also the pure-Python shared-memory ping-pong of the same passes (``python
shm``, :mod:`benchmarks.reference`: one copy in, one flag, one copy out, the least a
message between two Python processes costs here).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NAMES = ["latency-n2", "allreduce-n2", "bcast-n2", "allgather-n2", "reduce_scatter-n2",
         "barrier-n2", "allreduce-n4"]


def rows(base: Path) -> list[str]:
    """The table's rows (markdown), from ``base/pass-a`` and ``base/pass-b``."""
    out = []
    for name in NAMES:
        passes = [json.loads((base / f"pass-{p}" / f"{name}.json").read_text()) for p in "ab"]
        ours = next(k for k in passes[0]["lines"] if k != "MPI")
        for size in passes[0]["sizes"]:
            pc = [d["lines"][ours][str(size)]["us"] for d in passes]
            mpi = [d["lines"]["MPI"][str(size)]["us"] for d in passes]
            ratio = [a / b for a, b in zip(pc, mpi)]
            floor = [d["lines"].get("python shm", {}).get(str(size), {}).get("us")
                     for d in passes]
            cell = f"{floor[0]:.3g} / {floor[1]:.3g}" if None not in floor else ""
            out.append(f"| {name} | {size} | {pc[0]:.3g} / {pc[1]:.3g} | {mpi[0]:.3g} / "
                       f"{mpi[1]:.3g} | {min(ratio):.2f}-{max(ratio):.2f} | {cell} |")
    return out


if __name__ == "__main__":
    print("| benchmark | bytes | pycomm µs (A / B) | MPI µs (A / B) | ratio | python shm µs "
          "(A / B) |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows(Path(sys.argv[1]))))
