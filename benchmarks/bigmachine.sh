#!/usr/bin/env bash
# Benchmarks for a machine with enough cores that no rank shares one (8-16 ranks).
#
#   bash benchmarks/bigmachine.sh OUTDIR sweep LABEL [ROUNDS]
#       tune the cost model on this machine (OUTDIR/tune.json, once), then the
#       `--algorithm all` sweep of allreduce, bcast and allgather on 2, 4 and 8 ranks
#       (8 B .. 64 MiB) with that table: OUTDIR/sweep/LABEL-sweep-B-nN.json; judge with
#       PYCOMM_TUNE_FILE=OUTDIR/tune.json python -m benchmarks.sweep_report OUTDIR/sweep/*.json
#       (COLLECTIVES="allreduce" and RANKS="4 8" narrow the sweep)
#   bash benchmarks/bigmachine.sh OUTDIR scale
#       benchmarks.compare (pycomm shm, automatic choice, beside mpi4py under mpiexec
#       when importable, and the memcpy ceiling) for allreduce, bcast and allgather on
#       4, 8 and 16 ranks: OUTDIR/scale/B-nN.{md,json}
#   bash benchmarks/bigmachine.sh OUTDIR check
#       every algorithm validated against numpy (`-c`) on 13 and 16 ranks
#
# Each step runs under `timeout` (STEP_TIMEOUT seconds, default 120) so that one slow
# step cannot eat the others' time; a step that times out is reported and the next one
# runs. BUDGET (seconds, default unlimited) bounds the whole phase: a step that would
# start with less than 15 s left is skipped, and each step's timeout is cut to what is left.
set -u
out=${1:?OUTDIR}; phase=${2:?phase}
step_timeout=${STEP_TIMEOUT:-120}
budget=${BUDGET:-0}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
mkdir -p "$out"
py=${PYTHON:-python3}
sizes=8,64,512,4K,32K,256K,2M,16M,64M

step() {   # step NAME command...
    local name=$1; shift
    local t0=$SECONDS limit=$step_timeout
    if [ "$budget" -gt 0 ]; then
        local left=$((budget - SECONDS - 15))
        if [ "$left" -le 0 ]; then echo "step $name: skipped (budget spent)"; return; fi
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    timeout --kill-after=5 "$limit" "$@" >"$out/$name.txt" 2>"$out/$name.err"
    local rc=$?
    echo "step $name: rc=$rc, $((SECONDS - t0)) s"
}

case $phase in
sweep)
    label=${3:?LABEL}; rounds=${4:-5}
    if [ ! -s "$out/tune.json" ]; then
        step tune "$py" -m pycomm.tuning.tune -n 2 --transport shm --out "$out/tune.json"
        cat "$out/tune.txt"
    fi
    export PYCOMM_TUNE_FILE=$out/tune.json
    mkdir -p "$out/sweep"
    for b in ${COLLECTIVES:-allreduce bcast allgather}; do
        for n in ${RANKS:-2 4 8}; do
            step "sweep-$label-$b-n$n" "$py" launch.py -n "$n" "benchmarks/osu_$b.py" \
                --algorithm all --sizes "$sizes" -i 200 -x 20 --iter-large 10 \
                --warmup-large 2 --max-time 1 --rounds "$rounds" -q \
                --json "$out/sweep/$label-sweep-$b-n$n.json"
        done
    done
    "$py" -m benchmarks.sweep_report "$out"/sweep/*.json
    ;;
scale)
    mkdir -p "$out/scale"
    for b in allreduce bcast allgather; do
        for n in 4 8 16; do
            step "scale-$b-n$n" "$py" -m benchmarks.compare "$b" -n "$n" \
                --sizes 8,4K,64K,1M,16M --transports shm --auto-only --no-ceiling \
                --timeout "$step_timeout" --out "$out/scale"
        done
    done
    step reference "$py" benchmarks/reference.py --sizes 8,4K,64K,1M,16M \
        --json "$out/scale/reference.json"
    ;;
check)
    for b in allreduce bcast allgather reduce_scatter alltoall; do
        for n in 13 16; do
            step "check-$b-n$n" "$py" launch.py -n "$n" "benchmarks/osu_$b.py" \
                --algorithm all --sizes 0,4,4K,1M -i 3 -x 1 --iter-large 2 \
                --warmup-large 1 -c -q
        done
    done
    ;;
*)
    echo "unknown phase $phase (sweep, scale, check)" >&2; exit 2 ;;
esac
