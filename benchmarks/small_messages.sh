#!/usr/bin/env bash
# The small-message table of issue 17: pycomm (shm, automatic choice) beside mpi4py +
# MPICH in the same run, two passes back to back (this machine is noisy: report both).
#
#   bash benchmarks/small_messages.sh [OUTDIR]
#       latency, allreduce, bcast, allgather, reduce_scatter and barrier on 2 ranks at 8 B
#       and 4 KiB (bcast and reduce_scatter at 16 MiB too), and allreduce on 4 ranks; the
#       latency runs also time reference.py's pure-Python shared-memory ping-pong (the floor);
#       OUTDIR (default benchmarks/results/compare/<UTC date>-<HHMM>)/pass-{a,b}/B-nN.{md,json}
#
# Needs mpi4py and mpiexec for the MPI column (`pip install mpi4py mpich`);
# `python benchmarks/small_messages.py OUTDIR` prints the table from the two passes.
set -u
cd "$(dirname "$0")/.."
py=${PYTHON:-$(command -v python || command -v python3)}   # (some machines have python3 only)
base=${1:-benchmarks/results/compare/$(date -u +%Y-%m-%d-%H%M)}
if [ -e "$base" ]; then base="$base-$(date -u +%S)"; fi   # never overwrite a run
common=(--transports shm --auto-only)
for pass in a b; do
  out=$base/pass-$pass
  for spec in "latency 8,4K" "allreduce 8,4K" "bcast 8,4K,16M" "allgather 8,4K" \
              "reduce_scatter 8,4K,16M" "barrier 8"; do
    set -- $spec
    # latency keeps reference.py's lines: its pure-Python shm ping-pong is the floor
    floor=(--no-ceiling); [ "$1" = latency ] && floor=()
    "$py" -m benchmarks.compare "$1" -n 2 --sizes "$2" "${common[@]}" "${floor[@]}" \
      --out "$out" -- -i 2000 -x 200 --iter-large 30 --warmup-large 5 > /dev/null 2>&1 \
      || echo "FAILED: $1"
  done
  "$py" -m benchmarks.compare allreduce -n 4 --sizes 8,4K "${common[@]}" --out "$out" -- \
    -i 1000 -x 100 > /dev/null 2>&1 || echo "FAILED: allreduce -n 4"
done
echo "$base"
