#!/usr/bin/env bash
# Large collectives of one host's ranks (issue 17, "intra-host collectives for many
# ranks"): all-reduce, reduce-scatter and all-gather at 128 KiB-16 MiB on 2, 4 and 8 ranks
# over shared memory, every message algorithm and the automatic choice (direct reads,
# pycomm/shmdirect.py, from PYCOMM_SHM_DIRECT_BYTES) beside mpi4py + MPICH in the same run.
#
#   bash benchmarks/intra_host.sh [OUTDIR] [RANKS...]
#       OUTDIR (default benchmarks/results/compare/<UTC date>-<HHMM>-intra)/B-nN.{md,json};
#       RANKS default "2 4 8"
#
# Needs mpi4py and mpiexec for the MPI column (`pip install mpi4py mpich`).
set -u
cd "$(dirname "$0")/.."
base=${1:-benchmarks/results/compare/$(date -u +%Y-%m-%d-%H%M)-intra}
shift || true
ranks=${*:-2 4 8}
if [ -e "$base" ]; then base="$base-$(date -u +%S)"; fi   # never overwrite a run
for n in $ranks; do
  for bench in allreduce reduce_scatter allgather; do
    python -m benchmarks.compare "$bench" -n "$n" --sizes 128K,1M,16M --transports shm \
      --no-ceiling --out "$base" -- -i 20 -x 4 --iter-large 50 --warmup-large 10 \
      > /dev/null 2>&1 || echo "FAILED: $bench -n $n"
  done
done
echo "$base"
