#!/usr/bin/env bash
# device run 4: the session's last code, 16 ranks and 2 ranks beside MPICH
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -c 'import zipfile,glob; z=zipfile.ZipFile(glob.glob(".whl/mpich-*.whl")[0]); [z.extract(n,"/tmp/mp") for n in z.namelist() if "/lib/" in n]'
lib=$(ls -d /tmp/mp/*/data/lib)
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH LD_LIBRARY_PATH=$lib MPI4PY_LIBMPI=$lib/libmpi.so.12 MPI4PY_MPIABI=mpich PYTHONUNBUFFERED=1
res=/tmp/res4; mkdir -p $res
for b in allreduce bcast; do
  timeout 100 python3 -m benchmarks.compare $b -n 16 --sizes 8,4K,64K,1M,16M --transports shm --auto-only --no-ceiling --out $res/n16 >/dev/null 2>$res/$b-n16.err
  python3 -c "import json;d=json.load(open('$res/n16/$b-n16.json'));print('$b n16', {k:{s:round(v['us'],1) for s,v in l.items()} for k,l in d['lines'].items()})" 2>&1 | tail -1
done
for b in latency allreduce bcast; do
  timeout 60 python3 -m benchmarks.compare $b -n 2 --sizes 8,4K --transports shm --auto-only --no-ceiling --out $res/n2 -- -i 2000 -x 200 >/dev/null 2>$res/$b-n2.err
  python3 -c "import json;d=json.load(open('$res/n2/$b-n2.json'));print('$b n2', {k:{s:round(v['us'],2) for s,v in l.items()} for k,l in d['lines'].items()})" 2>&1 | tail -1
done
tar czf $OUT/res4.tgz -C $res .
