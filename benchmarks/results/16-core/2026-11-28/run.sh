#!/usr/bin/env bash
# device run: install carried wheels, then the small-message table and the 4-16 rank scale
set -u
t0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH LD_LIBRARY_PATH=/tmp/site/lib PYTHONUNBUFFERED=1
python3 -c 'import zipfile,glob; z=zipfile.ZipFile(glob.glob(".whl/mpich-*.whl")[0]); [z.extract(n,"/tmp/mp") for n in z.namelist() if "/lib/" in n]'
lib=$(ls -d /tmp/mp/*/data/lib); export LD_LIBRARY_PATH=$lib MPI4PY_LIBMPI=$lib/libmpi.so.12 MPI4PY_MPIABI=mpich
chk() { timeout 30 mpiexec -n 2 python3 -c "from mpi4py import MPI; print(\"mpi world\", MPI.COMM_WORLD.size, MPI.Get_library_version()[:30])"; }
chk | tee /tmp/chk.txt; if ! grep -q "mpi world 2" /tmp/chk.txt; then
  ls -la $lib; unset MPI4PY_MPIABI; chk | tee /tmp/chk.txt
  grep -q "mpi world 2" /tmp/chk.txt || { echo MPI BAD; exit 3; }
fi
res=/tmp/res; mkdir -p $res
{ nproc; lscpu; free -g; python3 -c 'import numpy,mpi4py,zmq;print(numpy.__version__,mpi4py.__version__,zmq.__version__)'; which mpiexec python3; git log --oneline -1 2>/dev/null; } > $res/machine.txt 2>&1
echo "setup $((SECONDS-t0)) s"
PYTHON=python3 bash benchmarks/small_messages.sh $res/small 2>&1 | tail -3
echo "small done $((SECONDS-t0)) s"
python3 benchmarks/small_messages.py $res/small > $res/small_table.md 2>&1; cat $res/small_table.md
PYTHON=python3 BUDGET=${SCALE_BUDGET:-260} STEP_TIMEOUT=90 bash benchmarks/bigmachine.sh $res scale
echo "scale done $((SECONDS-t0)) s"
for f in $res/scale/*.md; do echo "== $f"; cat $f; done
tar czf $OUT/res.tgz -C $res .
