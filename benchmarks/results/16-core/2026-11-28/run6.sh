#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/pyzmq*.whl || exit 1
repo=$(pwd)
ulimit -Hn; ulimit -Sn
one() { (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 60 python3 launch.py -n 16 benchmarks/osu_allreduce.py --sizes 8,4K -i 2000 -x 200 -q --json /tmp/r6.json >/dev/null 2>/tmp/r6.err); python3 -c "import json;d=json.load(open('/tmp/r6.json'));print('$2', ' '.join(f\"{r['size']}:{r['avg_us']:.1f}\" for r in d['rows']))" 2>&1 | tail -1; }
for pass in 1 2 3 4; do
  if [ $((pass % 2)) = 1 ]; then one $repo/.whl/base base; one $repo head; else one $repo head; one $repo/.whl/base base; fi
done
(cd $repo && PYTHONPATH=/tmp/site:$repo bash -c 'ulimit -Sn 1024; timeout 60 python3 launch.py -n 16 benchmarks/osu_allreduce.py --sizes 8,4K -i 2000 -x 200 -q --json /tmp/r6.json >/dev/null 2>&1'); python3 -c "import json;d=json.load(open('/tmp/r6.json'));print('head hard=1024?', ' '.join(f\"{r['size']}:{r['avg_us']:.1f}\" for r in d['rows']))"
(cd $repo && PYTHONPATH=/tmp/site:$repo bash -c 'ulimit -n 1024; timeout 60 python3 launch.py -n 16 benchmarks/osu_allreduce.py --sizes 8,4K -i 2000 -x 200 -q --json /tmp/r6.json >/dev/null 2>&1'); python3 -c "import json;d=json.load(open('/tmp/r6.json'));print('head limit 1024', ' '.join(f\"{r['size']}:{r['avg_us']:.1f}\" for r in d['rows']))"
