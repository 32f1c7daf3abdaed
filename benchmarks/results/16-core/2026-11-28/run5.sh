#!/usr/bin/env bash
# device run 5: the 16-rank and 2-rank small all-reduce, the session's code against 2edd054, alternated
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
repo=$(pwd)
for pass in 1 2 3; do
  for tree in "$repo" "$repo/.whl/base"; do
    lab=$([ "$tree" = "$repo" ] && echo head || echo base)
    for n in 16 2; do
      (cd $tree && PYTHONPATH=/tmp/site:$tree timeout 60 python3 launch.py -n $n benchmarks/osu_allreduce.py --sizes 8,4K,64K -i 2000 -x 200 --iter-large 300 --warmup-large 30 -q --json /tmp/r5-$lab-$n-$pass.json >/dev/null 2>/tmp/r5-$lab-$n-$pass.err)
      python3 -c "import json;d=json.load(open('/tmp/r5-$lab-$n-$pass.json'));print('p$pass $lab n$n', ' '.join(f\"{r['size']}:{r['avg_us']:.1f}\" for r in d['rows']))" 2>&1 | tail -1
    done
  done
done
uptime
