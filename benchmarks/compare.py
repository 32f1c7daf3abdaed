"""Run one benchmark across transports, algorithms, MPI and the machine's ceiling; compare.

``python -m benchmarks.compare BENCH [-n N] [-m MIN:MAX | --sizes LIST] [-- extra args]``
runs, each as a subprocess with a timeout (``--timeout``, default 600 s):

- pycomm on each transport (``launch.py --transport shm|tcp``), with ``--algorithm all``
  for a collective that has algorithms (one line per algorithm and one for the automatic
  choice; ``--auto-only`` keeps only the latter);
- the same script under ``mpiexec -n N ... --mpi4py`` when mpi4py is importable and
  ``mpiexec`` is on PATH (the reference);
- ``reference.py`` (memcpy and loopback TCP: the ceiling; for ``latency`` also the
  pure-Python shared-memory ping-pong, the floor under any Python library's shm latency).

Then it writes into ``--out`` (default ``benchmarks/results/compare/<UTC date>-<HHMM>``, a
folder per run), named ``BENCH-nN``:
``.md`` (times per size, and the ratios pycomm time / MPI time, and pycomm time / ceiling
time: memcpy of the same bytes for shm, or the Python shm ping-pong for ``latency``;
loopback TCP for tcp), ``.json`` (the same numbers
and every run's command, status and metadata) and, when matplotlib is installed, ``-lat.png``
and ``-bw.png`` (log-log, one line per transport/algorithm, MPI and the ceiling).

Which figure is "the time": avg_us for latency and blocking collectives; the
time-equivalent size / bandwidth for bw and bibw; Pure Comm. for nonblocking collectives.
Bandwidth: MB/s as the benchmark reports it (bw, bibw), else S / time with nccl-tests' S.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from benchmarks import HERE, names, script_path

ROOT = os.path.dirname(HERE)
BW_BENCHES = {"bw", "bibw"}


def _runs(bench: str, n: int, size_args: list[str], extra: list[str], transports: list[str],
          algorithms: bool, mpi: bool, ceiling: bool, out: str) -> list[dict[str, Any]]:
    """The commands to run: label, argv, JSON path."""
    script = script_path(bench)
    runs = []
    algo = ["--algorithm", "all"] if algorithms else []
    for t in transports:
        path = os.path.join(out, f"{bench}-n{n}-pycomm-{t}.json")
        runs.append({"label": f"pycomm {t}", "kind": "pycomm", "transport": t, "json": path,
                     "argv": [sys.executable, os.path.join(ROOT, "launch.py"), "-n", str(n),
                              "--transport", t, script, *size_args, *algo, *extra, "-q",
                              "--json", path]})
    if mpi:
        path = os.path.join(out, f"{bench}-n{n}-mpi4py.json")
        runs.append({"label": "MPI", "kind": "mpi", "json": path,
                     "argv": ["mpiexec", "-n", str(n), sys.executable, script, "--mpi4py",
                              *size_args, *extra, "-q", "--json", path]})
    if ceiling:
        path = os.path.join(out, f"{bench}-n{n}-reference.json")
        runs.append({"label": "ceiling", "kind": "ceiling", "json": path,
                     "argv": [sys.executable, script_path("reference"), *size_args,
                              "--json", path]})
    return runs


def _mpi_available() -> bool:
    if shutil.which("mpiexec") is None:
        return False
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def lines_from(doc: dict[str, Any], bench: str, label: str) -> dict[str, dict[int, dict]]:
    """Turn one run's JSON into {line label: {size: {"us": time, "mbps": bandwidth}}}."""
    out: dict[str, dict[int, dict]] = {}
    for r in doc.get("rows", []):
        if "error" in r:
            continue
        size = int(r["size"])
        algo = r.get("algorithm")
        name = label if algo in (None, "-", "default", "all") else f"{label} {algo}"
        if bench in BW_BENCHES:
            mbps = r["bandwidth_mbps"]
            moved = size * (2 if bench == "bibw" else 1)
            us = moved / mbps if mbps else None
        else:
            us = r.get("pure_comm_us", r.get("avg_us"))
            if "algbw_gbps" in r:
                mbps = r["algbw_gbps"] * 1e3
            else:
                mbps = size / us if us else None
        if us is not None:
            out.setdefault(name, {})[size] = {"us": us, "mbps": mbps}
    return out


def ceiling_lines(doc: dict[str, Any], bench: str) -> dict[str, dict[int, dict]]:
    """memcpy and loopback TCP as lines: time for the size, and bandwidth; for the
    latency benchmark also the pure-Python shared-memory ping-pong (``python shm``)."""
    mem, tcp, shm = {}, {}, {}
    for r in doc.get("rows", []):
        size = int(r["size"])
        if r.get("memcpy_gbps"):
            mbps = r["memcpy_gbps"] * 1e3
            mem[size] = {"us": size / mbps, "mbps": mbps}
        if bench in BW_BENCHES and r.get("tcp_stream_mbps"):
            tcp[size] = {"us": size / r["tcp_stream_mbps"], "mbps": r["tcp_stream_mbps"]}
        elif r.get("tcp_latency_us"):
            tcp[size] = {"us": r["tcp_latency_us"], "mbps": size / r["tcp_latency_us"]}
        if bench == "latency" and r.get("shm_latency_us"):
            shm[size] = {"us": r["shm_latency_us"], "mbps": size / r["shm_latency_us"]}
    lines = {"memcpy": mem, "loopback TCP": tcp}
    if shm:
        lines["python shm"] = shm
    return lines


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return ""
    return f"{x:.{digits}g}" if abs(x) < 10 ** digits else f"{x:.0f}"


def markdown(bench: str, n: int, lines: dict, sizes: list[int], meta: dict) -> str:
    """The times table and the two ratio tables as markdown."""
    pyc = [k for k in lines if k.startswith("pycomm")]
    unit = "MB/s" if bench in BW_BENCHES else "µs"
    out = [f"## osu_{bench}, {n} ranks", "",
           f"Machine: {meta.get('host')} ({meta.get('cpu_count')} cores), "
           f"loadavg {meta.get('loadavg')}, {meta.get('date')}. "
           + ("Oversubscribed: more ranks than cores. " if n > (meta.get("cpu_count") or n)
              else ""), ""]
    cols = list(lines)
    out.append(f"Times ({unit}: " + ("bandwidth" if unit == "MB/s" else "time per call")
               + "; ceiling lines: memcpy of the same bytes, loopback TCP"
               + (", python shm ping-pong" if "python shm" in lines else "") + ")")
    out.append("")
    out.append("| size | " + " | ".join(cols) + " |")
    out.append("|---" * (len(cols) + 1) + "|")
    for s in sizes:
        cells = []
        for k in cols:
            v = lines[k].get(s)
            cells.append(_fmt(v and (v["mbps"] if unit == "MB/s" else v["us"])))
        out.append(f"| {s} | " + " | ".join(cells) + " |")
    for ref, title in (("MPI", "pycomm time / MPI time (lower is better; 1 = MPI's speed)"),
                       (None, "pycomm time / ceiling time (shm: "
                        + ("python shm ping-pong" if "python shm" in lines else "memcpy")
                        + ", tcp: loopback TCP)")):
        if ref and ref not in lines:
            continue
        out += ["", title, "", "| size | " + " | ".join(pyc) + " |",
                "|---" * (len(pyc) + 1) + "|"]
        for s in sizes:
            cells = []
            for k in pyc:
                base = ref or ("loopback TCP" if " tcp" in k else
                               "python shm" if "python shm" in lines else "memcpy")
                a, b = lines[k].get(s), lines.get(base, {}).get(s)
                cells.append(_fmt(a["us"] / b["us"]) if a and b and b["us"] else "")
            out.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def plots(bench: str, n: int, lines: dict, base: str) -> list[str]:
    """Latency and bandwidth against size, log-log; return the files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib is not installed: no plots (pip install matplotlib)",
              file=sys.stderr)
        return []
    files = []
    for key, ylabel, suffix in (("us", "time per call (µs)", "lat"),
                                ("mbps", "bandwidth (MB/s)", "bw")):
        fig, ax = plt.subplots(figsize=(9, 4.5), dpi=80)
        for label, pts in lines.items():
            xs = [s for s in sorted(pts) if s > 0 and pts[s][key]]
            if not xs:
                continue
            style = "k--" if label == "memcpy" else "k:" if label == "loopback TCP" else \
                "k-o" if label == "MPI" else "-." if " tcp" in label else "-"
            ax.plot(xs, [pts[s][key] for s in xs], style, label=label, markersize=3)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"osu_{bench}, {n} ranks")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        path = f"{base}-{suffix}.png"
        fig.savefig(path)
        plt.close(fig)
        files.append(path)
    return files


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; return 0 when every run succeeded, 1 otherwise."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench", help="benchmark name, e.g. allreduce or osu_latency")
    p.add_argument("-n", type=int, default=2, help="ranks (default 2)")
    p.add_argument("-m", "--message-size", default=None, metavar="MIN:MAX")
    p.add_argument("--sizes", default=None, metavar="LIST", help="e.g. 8,4K,64K,1M,16M")
    p.add_argument("--transports", default="shm,tcp")
    p.add_argument("--auto-only", action="store_true",
                   help="collectives: only the automatic choice, not every algorithm")
    p.add_argument("--no-mpi", action="store_true", help="skip the mpi4py reference")
    p.add_argument("--no-ceiling", action="store_true", help="skip reference.py")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run (600)")
    p.add_argument("--out", default=None,
                   help="folder (default benchmarks/results/compare/<UTC date>-<HHMM>)")
    args = p.parse_args(argv)
    bench = args.bench.removeprefix("osu_").removesuffix(".py")
    if bench not in names() or bench == "reference":
        p.error(f"unknown benchmark {args.bench!r}; see python -m benchmarks --list")
    if args.out is None:
        stamp = time.strftime("%Y-%m-%d-%H%M", time.gmtime())
        args.out = os.path.join(HERE, "results", "compare", stamp)
    os.makedirs(args.out, exist_ok=True)
    size_args = (["--sizes", args.sizes] if args.sizes else []) + \
        (["-m", args.message_size] if args.message_size else [])
    collective = bench not in ("latency", "bw", "bibw", "multi_lat")
    mpi = not args.no_mpi and _mpi_available()
    if not args.no_mpi and not mpi:
        print("# mpi4py or mpiexec missing: no MPI reference", file=sys.stderr)
    runs = _runs(bench, args.n, size_args, extra, args.transports.split(","),
                 collective and not args.auto_only and bench != "ibarrier", mpi,
                 not args.no_ceiling, args.out)
    lines: dict[str, dict[int, dict]] = {}
    meta: dict[str, Any] = {}
    ok = True
    for run in runs:
        print(f"# running: {' '.join(run['argv'])}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(run["argv"], check=False, cwd=ROOT, capture_output=True, text=True,
                                  timeout=args.timeout)
            run["returncode"], run["stderr_tail"] = proc.returncode, proc.stderr[-2000:]
        except subprocess.TimeoutExpired:
            run["returncode"], run["stderr_tail"] = None, f"timed out after {args.timeout} s"
        run["seconds"] = round(time.perf_counter() - t0, 1)
        if run["returncode"] != 0 or not os.path.exists(run["json"]):
            ok = False
            print(f"# FAILED ({run['returncode']}): {run['label']}: "
                  f"{run['stderr_tail'][-500:]}", file=sys.stderr)
            continue
        with open(run["json"]) as f:
            doc = json.load(f)
        run["meta"] = doc.get("meta")
        ranks = (run["meta"] or {}).get("world_size")
        if run["kind"] != "ceiling" and ranks != args.n:
            # e.g. mpiexec of one MPI while mpi4py loads another: n singletons, each timing
            # a 1-rank collective (seen on a machine whose mpi4py found Open MPI's library
            # while PATH had MPICH's mpiexec)
            ok = False
            run["rejected"] = f"ran as {ranks} rank(s), not {args.n}"
            print(f"# REJECTED: {run['label']} {run['rejected']}: its numbers are left out",
                  file=sys.stderr)
            continue
        if run["kind"] == "ceiling":
            lines.update(ceiling_lines(doc, bench))
        else:
            lines.update(lines_from(doc, bench, run["label"]))
            if run["kind"] == "pycomm" and not meta:
                meta = doc.get("meta", {})
    sizes = sorted({s for pts in lines.values() for s in pts
                    if any(s in lines[k] for k in lines if k.startswith("pycomm"))})
    base = os.path.join(args.out, f"{bench}-n{args.n}")
    md = markdown(bench, args.n, lines, sizes, meta)
    files = plots(bench, args.n, lines, base)
    if files:
        md += "\n" + "\n".join(f"![{os.path.basename(f)}]({os.path.basename(f)})"
                               for f in files) + "\n"
    with open(base + ".md", "w") as f:
        f.write(md)
    with open(base + ".json", "w") as f:
        json.dump({"benchmark": bench, "ranks": args.n, "sizes": sizes,
                   "lines": {k: {str(s): v for s, v in pts.items()} for k, pts in lines.items()},
                   "runs": runs}, f, indent=1)
    print(md)
    print(f"# wrote {base}.md, {base}.json" + "".join(f", {x}" for x in files),
          file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
