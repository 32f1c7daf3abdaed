"""Proof benchmark of the hierarchical collectives (issue 16) on emulated hosts.

Builds ``--hosts`` emulated hosts (:mod:`benchmarks.cluster.netns`: network namespaces on
a bridge, private hostname and /dev/shm each, every host's egress shaped by ``tc tbf``
to ``--rate``), then, ``--rounds`` times, runs one job per placement (block, then cyclic)
with the multi-node launcher, ``--nproc`` ranks per host. Each job times ``--collective``
(allreduce by default; bcast, reduce, allgather) on ``--mib`` MiB of float32 under every
algorithm of ``--algs`` (``auto``: the automatic choice), alternating (see
:mod:`benchmarks.cluster._hier_bench_rank`), and counts the bytes each host sent over its
link from the interface counters.

Reported per placement and algorithm: median and spread (min-max) of the slowest rank's
time, the link bytes per call (all hosts' eth0 tx, headers and ACKs included) against the
hierarchical ideal (all-reduce ``2 (H-1) n``: each host sends ``2 (H-1)/H n``; all-gather
``(H-1) n``; bcast and reduce ``(H-1) n``), and the link-bound floor: the busiest link's
share (:data:`LINK_SHARE`: ``2 (H-1)/H n``, ``(H-1)/H n``, ``n``) at ``rate``. Needs root;
everything is torn down on exit::

    sudo python -m benchmarks.cluster.hier_bench --hosts 2 --nproc 2 --rate 2gbit \\
        --mib 16 --reps 7 --rounds 2 --raw --out /tmp/hier.json

``--raw`` first times plain TCP sockets carrying the same load between the two hosts (the
link's practical ceiling: the floor plus TCP/IP headers).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.cluster.netns import Cluster

ROOT = Path(__file__).resolve().parents[2]
RANK = str(ROOT / "benchmarks" / "cluster" / "_hier_bench_rank.py")
RAW = str(ROOT / "benchmarks" / "cluster" / "_raw_tcp.py")
ALGS = {"allreduce": "ring,recursive_doubling,rabenseifner,hierarchical,auto",
        "bcast": "binomial,scatter_allgather,pipeline,hierarchical,auto",
        "reduce": "binomial,rabenseifner,hierarchical,auto",
        "allgather": "ring,recursive_doubling,bruck,hierarchical,auto"}
# bytes each host's link must carry, in units of n, for H hosts: the floor's numerator
# (a reduction's result or a broadcast crosses every link once; an all-reduce is a
# reduce-scatter and an all-gather; an all-gather brings each host the other blocks)
LINK_SHARE = {"allreduce": lambda h: 2 * (h - 1) / h, "allgather": lambda h: (h - 1) / h,
              "bcast": lambda h: 1.0, "reduce": lambda h: 1.0}
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def rate_bits(rate: str) -> float:
    """tc's rate text (``2gbit``) in bits per second (tc: k, m, g are powers of 1000).

    Raises:
        ValueError: not ``<number><bit|kbit|mbit|gbit>``.
    """
    m = re.fullmatch(r"([0-9.]+)\s*(bit|kbit|mbit|gbit)", rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: expected e.g. 2gbit or 500mbit")
    return float(m.group(1)) * _UNITS[m.group(2)]


def run_job(c: Cluster, nproc: int, placement: str, port: int, env: dict) -> list[dict]:
    """One job across every host of ``c``; the JSON records rank 0 printed."""
    procs = [c.popen(k + 1, [sys.executable, "launch.py", "--nnodes", str(c.n),
                             "--node-rank", str(k), "--master-addr", c.addr(1),
                             "--master-port", str(port), "--nproc-per-node", str(nproc),
                             "--placement", placement, RANK],
                     cwd=str(ROOT), env=env, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True)
             for k in range(c.n)]
    texts = []
    for k, p in enumerate(procs):
        text, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"{placement} job failed on host {k + 1}:\n{text}")
        texts.append(text)
    return [json.loads(line[line.index("{"):]) for text in texts
            for line in text.splitlines() if '"alg"' in line]


def run_raw(c: Cluster, flows: int, nbytes_per_host: int, reps: int) -> list[float]:
    """Plain TCP between hosts 1 and 2: ``flows`` connections carrying ``nbytes_per_host``
    each way at once (the all-reduce's link load on 2 hosts); ms per repetition."""
    mib = str(nbytes_per_host / 2**20)
    server = c.popen(2, [sys.executable, RAW, "serve", c.addr(2), str(flows), mib, str(reps)])
    done = c.run(1, [sys.executable, RAW, "dial", c.addr(2), str(flows), mib, str(reps)],
                 timeout=120)
    server.wait(timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"raw TCP reference failed: {done.stderr}")
    return [float(line.split()[1]) for line in done.stdout.splitlines()
            if line.startswith("RAW ")]


def summarize(records: list[dict], hosts: int, rate: float,
              collective: str = "allreduce") -> list[dict]:
    """Per (placement, algorithm): median/min/max ms, link bytes, ratios against the
    floor (the busiest link's bytes at ``rate``) and the hierarchical ideal bytes."""
    rows = []
    nbytes = records[0]["nbytes"]
    share = LINK_SHARE[collective](hosts)
    floor = share * nbytes * 8 / rate
    # all hosts' bytes: bcast and reduce send n over H-1 links, the others share each
    ideal = (hosts - 1) * nbytes if collective in ("bcast", "reduce") else \
        hosts * share * nbytes
    keys = dict.fromkeys((r["placement"], r["alg"]) for r in records)
    for placement, alg in keys:
        mine = [r for r in records if (r["placement"], r["alg"]) == (placement, alg)]
        ms = [1e3 * r["s"] for r in mine]
        link = statistics.median(r["link_bytes"] for r in mine)
        rows.append({"placement": placement, "alg": alg, "chosen": mine[0]["chosen"],
                     "n": len(ms), "median_ms": statistics.median(ms), "min_ms": min(ms),
                     "max_ms": max(ms), "link_bytes": link, "link_vs_ideal": link / ideal,
                     "vs_floor": statistics.median(ms) / (1e3 * floor),
                     "floor_ms": 1e3 * floor, "hosts": mine[0]["hosts"]})
    return rows


def table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    out = ["| placement | algorithm | median ms | min-max ms | x floor | link MiB/call | "
           "x ideal |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        alg = r["alg"] if r["alg"] != "auto" else f"auto ({r['chosen']})"
        out.append(f"| {r['placement']} | {alg} | {r['median_ms']:.1f} | "
                   f"{r['min_ms']:.1f}-{r['max_ms']:.1f} | {r['vs_floor']:.2f} | "
                   f"{r['link_bytes'] / 2**20:.1f} | {r['link_vs_ideal']:.2f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=2, help="ranks per host")
    ap.add_argument("--rate", default="2gbit", help="tc tbf rate of every host's link")
    ap.add_argument("--mib", type=float, default=16.0, help="all-reduce size (float32)")
    ap.add_argument("--reps", type=int, default=7, help="timed calls per algorithm and job")
    ap.add_argument("--rounds", type=int, default=2, help="block + cyclic job pairs")
    ap.add_argument("--collective", default="allreduce", choices=sorted(ALGS))
    ap.add_argument("--algs", default=None, help="comma-separated (default: all of the "
                    "collective's flat algorithms, hierarchical and auto)")
    ap.add_argument("--prefix", default="pchb")
    ap.add_argument("--out", default=None, help="write the records and summary as JSON")
    ap.add_argument("--tune-file", default=None,
                    help="PYCOMM_TUNE_FILE for the ranks (e.g. written by pycomm/tuning/tune_links.py)")
    ap.add_argument("--env", action="append", default=[], metavar="VAR=VALUE",
                    help="another PYCOMM_ variable for the ranks (repeatable)")
    ap.add_argument("--raw", action="store_true",
                    help="also time plain TCP carrying the same link load (2 hosts)")
    args = ap.parse_args(argv)
    rate = rate_bits(args.rate)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYCOMM_", "MASTER_"))}
    env.update({"PYTHONPATH": str(ROOT), "PYCOMM_TIMEOUT": "120",
                "HB_BYTES": str(int(args.mib * 2**20)), "HB_REPS": str(args.reps),
                "HB_ALGS": args.algs or ALGS[args.collective], "HB_COLL": args.collective})
    if args.tune_file:
        env["PYCOMM_TUNE_FILE"] = os.path.abspath(args.tune_file)
    for item in args.env:
        name, _, value = item.partition("=")
        if not name.startswith("PYCOMM_") or not _:
            raise SystemExit(f"--env {item!r}: expected PYCOMM_NAME=VALUE")
        env[name] = value
    records = []
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load = [os.getloadavg()]
    raw: list[float] = []
    with Cluster(args.hosts, prefix=args.prefix, rate=args.rate) as c:
        if args.raw and args.hosts == 2:
            share = LINK_SHARE[args.collective](args.hosts)
            raw = run_raw(c, args.nproc, int(share * args.mib * 2**20), args.reps)
        job = 0
        for rnd in range(args.rounds):
            for placement in ("block", "cyclic"):
                port = 29700 + (os.getpid() + job) % 200
                for r in run_job(c, args.nproc, placement, port, env):
                    records.append({**r, "placement": placement, "round": rnd})
                job += 1
                load.append(os.getloadavg())
    rows = summarize(records, args.hosts, rate, args.collective)
    print(f"{args.hosts} hosts x {args.nproc} ranks, {args.rate} links, {args.mib:g} MiB "
          f"float32 {args.collective}; floor {rows[0]['floor_ms']:.1f} ms; "
          f"{args.rounds} rounds x {args.reps} reps per job"
          f"{'; PYCOMM_TUNE_FILE=' + args.tune_file if args.tune_file else ''}"
          f"{'; ' + ' '.join(args.env) if args.env else ''}; load "
          f"{', '.join(f'{x[0]:.1f}' for x in load)}")
    if raw:
        print(f"plain TCP, {args.nproc} flows carrying the floor's bytes each way: median "
              f"{statistics.median(raw):.1f} ms ({min(raw):.1f}-{max(raw):.1f}), "
              f"{statistics.median(raw) / rows[0]['floor_ms']:.2f} x floor")
    print(table(rows))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"started": started, "args": vars(args), "cpus": os.cpu_count(),
                       "load1": [x[0] for x in load], "raw_tcp_ms": raw, "rows": rows,
                       "records": records},
                      fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
