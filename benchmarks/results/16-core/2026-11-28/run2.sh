#!/usr/bin/env bash
# device run 2: why small calls on 16 ranks of 16 cores vary 2-3x between runs
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -c 'import zipfile,glob; z=zipfile.ZipFile(glob.glob(".whl/mpich-*.whl")[0]); [z.extract(n,"/tmp/mp") for n in z.namelist() if "/lib/" in n]'
lib=$(ls -d /tmp/mp/*/data/lib)
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH LD_LIBRARY_PATH=$lib MPI4PY_LIBMPI=$lib/libmpi.so.12 MPI4PY_MPIABI=mpich PYTHONUNBUFFERED=1
res=/tmp/res2; mkdir -p $res
one() {  # label n env... : osu_allreduce 8 B and 64 KiB, one job
  local label=$1 n=$2; shift 2
  env "$@" timeout 60 python3 launch.py -n $n benchmarks/osu_allreduce.py --sizes 8,64K -i 3000 -x 300 --iter-large 300 --warmup-large 30 -q --json $res/$label.json >/dev/null 2>$res/$label.err
  python3 -c "import json,sys;d=json.load(open('$res/$label.json'));print('$label', ' '.join(f\"{r['size']}:{r['avg_us']:.1f}\" for r in d['rows']))" 2>/dev/null || echo "$label failed"
}
for pass in 1 2 3; do
  one p$pass-n16 16
  one p$pass-n15 15
  one p$pass-n12 12
  one p$pass-n16-spin5 16 PYCOMM_SPIN_US=5
  one p$pass-n16-yield 16 PYCOMM_SPIN_US=5 PYCOMM_YIELD_US=300
  timeout 60 mpiexec -n 16 python3 benchmarks/osu_allreduce.py --mpi4py --sizes 8,64K -i 3000 -x 300 --iter-large 300 --warmup-large 30 -q --json $res/p$pass-mpi16.json >/dev/null 2>&1
  python3 -c "import json;d=json.load(open('$res/p$pass-mpi16.json'));print('p$pass-mpi16', d['meta'].get('world_size'), ' '.join(f\"{r['size']}:{r['avg_us']:.1f}\" for r in d['rows']))"
done
uptime
tar czf $OUT/res2.tgz -C $res .
