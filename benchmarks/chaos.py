"""Chaos trials (issue 15's proof): random faults on one rank of real jobs, tabulated.

``python -m benchmarks.chaos --trials N --seed S [--transports shm,tcp,rdma] [--sizes 3,4]
[--json out.json] [--logs DIR]``;
``... --only 6 --repeat 8`` runs trial 6 of that plan 8 times (a miss's repro).

Each trial starts ``launch.py -n SIZE --transport T --timeout 3`` (with
``PYCOMM_STALL_WARN=1.5``) on ``benchmarks/_chaos_rank.py``: every rank runs the same
seeded schedule of Allreduce / Bcast / Allgather / Reduce_scatter_block / Alltoall calls
(16, 3000 or 70 000 float64 per rank: eager and rendezvous), checking every result against
numpy, and one random *culprit* rank injects one fault at one random call:

=========  ===================================================================================
kill       SIGKILL itself, right before the call          (the job must end)
stop       SIGSTOP itself (a stopped process)             (the job must end)
exit       ``os._exit(3)``                                (the job must end)
raise      ``raise RuntimeError``                         (the job must end)
hang       ``time.sleep(60)``                             (the job must end)
badarg     a strided or read-only buffer in the call      (every rank catches, goes on)
mismatch   a different dtype, count, root or collective   (every rank catches, goes on)
=========  ===================================================================================

What is measured, per trial (the rules are exact; misses are printed with their text):

* **ended ≤ 5 s** — fatal kinds: the launcher exited non-zero with its verdict line
  (``pycomm.launch: ...``) within 5 s of the fault (the culprit's wall-clock stamp just
  before injecting it, to the moment the launcher process was reaped). Recoverable kinds:
  every rank raised a ``CommError`` subclass in the faulty call or one of the next two
  (a rank that needs nothing from the culprit may instead complete it *correctly*, e.g.
  a Bcast leaf; a mismatched call must raise on every rank), the last of those errors came
  within 5 s of the fault, and the job then ran to the end with exit code 0 (the
  communicator was usable again).
* **end s** (median, max) — the latency behind "ended": fault to launcher exit (fatal),
  fault to the last rank's error (recoverable). **named s** (median) — fault to the first
  line that names the culprit as ``rank C``: a surviving rank's error or stall warning, or
  the launcher's verdict (fatal); the last rank's error (recoverable). The gap between the
  two is teardown: the time the launcher and the ranks take to stop once it is known.
* **wrong** — ``CHAOS WRONG`` lines: a completed call whose result differs from numpy's.
  Must be 0.
* **silent** — mismatch trials: ranks that completed the mismatched call and raised
  nothing in it or the next two (they never learn the call was inconsistent, though their
  own values were checked and may be right, e.g. the root of a Bcast). Target 0.
* **leaks** — after the launcher exited: processes still alive (not zombies, 1 s after
  the exit) whose environment holds the job's ``PYCOMM_JOB_ID`` or whose process group is
  a rank's; ``/dev/shm/pycomm-<jobid>-*`` entries; TCP ports in LISTEN that the ranks
  listened on (the store's, and each rank's own, read from /proc at start). Must be 0.
* **names culprit** — fatal kinds: the launcher's verdict line begins
  ``pycomm.launch: rank C `` (C the culprit). Recoverable kinds: the first error every rank
  caught contains ``rank C`` as words.
* **names call** — fatal kinds: the faulty call's collective (``Allreduce``, ...; for a
  Bcast, the next call that is not a Bcast also counts: ranks upstream of the culprit can
  finish that Bcast and the Bcasts after it; on rdma the call before it also counts: a
  killed or stopped rank's last sends may still sit in its own emulated NIC, so that the
  survivors never finish that call and rightly name it) appears as a word in the
  launcher's verdict line, the last line of a surviving rank's traceback (``[r]
  pycomm.errors.X: ...``), or a surviving rank's stall warning (``[r] pycomm: rank r:
  warning: ...``); traceback source lines and flight-recorder tables do not count.
  Recoverable kinds: the first error every rank caught names the scheduled collective.

Exits 1 when any trial had a wrong result or a leak (2 when a trial did not end within
the hard limit of 45 s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

try:
    from benchmarks import _chaos_rank as rankmod
except ImportError:                             # run as a plain file
    import _chaos_rank as rankmod  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = str(ROOT / "launch.py")
WORKER = str(ROOT / "benchmarks" / "_chaos_rank.py")
JOB_TIMEOUT = 3.0          # --timeout of every job (PYCOMM_TIMEOUT)
STALL_WARN = 1.5           # PYCOMM_STALL_WARN, below the timeout
BOUND_S = 5.0              # issue 15's target: ended with a named error within 5 s
HARD_LIMIT_S = 45.0        # a trial still running then is killed and counted as not ended
MAX_CALL = 6               # the fault is at call 0..MAX_CALL-1 of the schedule
SHM_DIR = "/dev/shm"


@dataclass
class Trial:
    """One trial's plan and, once run, its measurements."""

    index: int
    kind: str
    transport: str
    size: int
    culprit: int
    call: int
    seed: int
    variant: str
    coll: str = ""                 # the faulty call's collective (as scheduled)
    next_coll: str = ""
    prev_coll: str = ""
    count: int = 0
    # measured
    exit_code: int | None = None
    wall_s: float = 0.0            # launch to launcher exit
    latency_s: float | None = None  # fault to end (fatal) / to the last error (recoverable)
    end_s: float | None = None     # fault to launcher exit
    named_s: float | None = None   # fault to the first error line naming the culprit
    ended: bool = False            # ended with a named error within BOUND_S
    timed_out: bool = False        # still running after HARD_LIMIT_S (killed)
    wrong: int = 0
    silent: list = field(default_factory=list)
    leaks: list = field(default_factory=list)
    names_culprit: bool = False
    names_call: bool = False
    verdict: str = ""
    evidence: str = ""             # the error text the naming rules looked at
    caught: dict = field(default_factory=dict)   # rank -> [(call, type, msg)] (recoverable)
    notes: list = field(default_factory=list)


def plan(trials: int, seed: int, transports: list[str], sizes: list[int],
         kinds: tuple[str, ...] = rankmod.KINDS) -> list[Trial]:
    """``trials`` trials cycling through every (kind, transport) pair in a seeded order,
    each with a random size, culprit, call, schedule and fault variant."""
    rng = random.Random(seed)
    combos: list[tuple[str, str]] = []
    out = []
    for i in range(trials):
        if not combos:
            combos = [(k, t) for k in kinds for t in transports]
            rng.shuffle(combos)
        kind, transport = combos.pop()
        size = rng.choice(sizes)
        culprit, call, tseed = rng.randrange(size), rng.randrange(MAX_CALL), rng.randrange(2**31)
        out.append(make_trial(i, kind, transport, size, culprit, call, tseed,
                              random.Random(tseed + 1)))
    return out


def make_trial(index: int, kind: str, transport: str, size: int, culprit: int, call: int,
               seed: int, rng: random.Random | None = None) -> Trial:
    """A trial with its fault variant chosen for the scheduled call."""
    rng = rng or random.Random(seed + 1)
    calls = rankmod.schedule(seed, call + rankmod.GUARDED + rankmod.AFTER, size)
    c = calls[call]
    if kind == "badarg":
        variant = rankmod.badarg_variant(c, culprit, rng)
    elif kind == "mismatch":
        variant = rankmod.mismatch_variant(c, rng)
    else:
        variant = kind
    later = [x["coll"] for x in calls[call + 1:] if x["coll"] != "Bcast"]   # (names call)
    return Trial(index, kind, transport, size, culprit, call, seed, variant, coll=c["coll"],
                 next_coll=later[0] if later else "Bcast", count=c["count"],
                 prev_coll=calls[call - 1]["coll"] if call else "")


# -- running one trial -----------------------------------------------------------------------
def _reader(pipe, sink: list, stamps: list) -> None:
    for raw in iter(pipe.readline, b""):
        stamps.append(time.time())
        sink.append(raw.decode(errors="replace").rstrip("\n"))
    pipe.close()


def _job_processes(job: str | None, pgids: set[int]) -> list[tuple[int, str]]:
    """(pid, status) of live processes carrying ``PYCOMM_JOB_ID=job`` or in ``pgids``."""
    found, me = [], os.getpid()
    for proc in psutil.process_iter(["status"]):
        try:
            status = proc.info["status"]
            if proc.pid != me and status not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) and (
                    os.getpgid(proc.pid) in pgids
                    or (job and proc.environ().get("PYCOMM_JOB_ID") == job)):
                found.append((proc.pid, status))
        except (psutil.Error, OSError):
            continue            # gone meanwhile, or not ours to read
    return found


def _listening(ports: set[int]) -> list[int]:
    """Which of ``ports`` some process of this host listens on (TCP)."""
    return sorted({c.laddr.port for c in psutil.net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN} & ports)


def _leaks(job: str | None, pgids: set[int], ports: set[int]) -> list[str]:
    """What the job left behind; kills leaked processes and removes leaked segments."""
    leaks = []
    deadline = time.monotonic() + 1.0
    procs = _job_processes(job, pgids)
    while procs and time.monotonic() < deadline:     # let dying processes finish dying
        time.sleep(0.05)
        procs = _job_processes(job, pgids)
    for pid, state in procs:
        leaks.append(f"process {pid} (state {state})")
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    if job:
        for name in os.listdir(SHM_DIR):
            if name.startswith(f"pycomm-{job}-"):
                leaks.append(f"{SHM_DIR}/{name}")
                try:
                    os.unlink(os.path.join(SHM_DIR, name))
                except OSError:
                    pass
    leaks += [f"listening port {p}" for p in _listening(ports)]
    return leaks


_START = re.compile(r"^\[(\d+)\] CHAOS START rank=(\d+) pid=(\d+) job=(\S+) "
                    r"master_port=(\S+) listen=(\S*)$")
_FAULT = re.compile(r"^\[\d+\] CHAOS FAULT t=([\d.]+) ")
_CAUGHT = re.compile(r"^\[\d+\] CHAOS CAUGHT t=([\d.]+) rank=(\d+) call=(\d+) type=(\w+) "
                     r"msg=(.*)$")
_SILENT = re.compile(r"^\[\d+\] CHAOS SILENT rank=(\d+) call=(\d+)$")
_EXC = re.compile(r"^\[(\d+)\] ([\w.]*(?:Error|Exception|Exit|Interrupt))(?:: (.*))?$")
_WARN = re.compile(r"^\[(\d+)\] pycomm: rank \d+: warning: .*$")


def _word(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text) is not None


def run_trial(t: Trial, *, env: dict | None = None, log_dir: str | None = None) -> Trial:
    """Run trial ``t`` (filling in its measurements) and return it; with ``log_dir``, write
    its output there (``trial<index>.log``, each line stamped with seconds since launch)."""
    spec = {"kind": t.kind, "culprit": t.culprit, "call": t.call, "seed": t.seed,
            "variant": t.variant}
    env = {**os.environ, **(env or {}), "PYCOMM_STALL_WARN": str(STALL_WARN),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, LAUNCH, "-n", str(t.size), "--transport", t.transport,
           "--timeout", str(JOB_TIMEOUT), WORKER, json.dumps(spec)]
    out: list[str] = []
    err: list[str] = []
    out_t: list[float] = []
    err_t: list[float] = []         # when each stderr line reached us
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=str(ROOT), env=env,
                            start_new_session=True)
    readers = [threading.Thread(target=_reader, args=(p, s, ts), daemon=True)
               for p, s, ts in ((proc.stdout, out, out_t), (proc.stderr, err, err_t))]
    for r in readers:
        r.start()
    try:
        proc.wait(timeout=HARD_LIMIT_S)
    except subprocess.TimeoutExpired:
        t.timed_out = True
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                pass
            try:
                proc.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
    t_end = time.time()
    for r in readers:
        r.join(5)
    t.exit_code, t.wall_s = proc.returncode, t_end - t0
    if log_dir:
        lines = sorted([*zip(out_t, ["out"] * len(out), out),
                        *zip(err_t, ["err"] * len(err), err)], key=lambda x: x[0])
        name, n = Path(log_dir, f"trial{t.index}.log"), 1
        while name.exists():            # --repeat: keep every run's log
            name, n = Path(log_dir, f"trial{t.index}.{n}.log"), n + 1
        name.write_text(
            f"{describe(t)}\n" + "".join(f"+{w - t0:7.3f} {k} {line}\n" for w, k, line in lines)
            + f"+{t_end - t0:7.3f} launcher exited {proc.returncode}\n")

    # what the ranks said
    job, pgids, ports = None, set(), set()
    for line in out:
        m = _START.match(line)
        if m:
            job = m[4]
            pgids.add(int(m[3]))
            if m[5].isdigit():
                ports.add(int(m[5]))
            ports.update(int(p) for p in m[6].split(",") if p)
    if job is None:
        t.notes.append("no rank reported its start")
    t.leaks = _leaks(job, pgids, ports)
    fault = next((float(m[1]) for m in map(_FAULT.match, out) if m), None)
    if fault is None:
        t.notes.append("the culprit never reported its fault")
    t.wrong = sum(1 for line in out if " CHAOS WRONG " in line)
    verdicts = [line for line in err if line.startswith("pycomm.launch:")]
    t.verdict = verdicts[0] if verdicts else ""
    t.end_s = t_end - fault if fault is not None else None
    if t.kind in rankmod.FATAL:
        _judge_fatal(t, err, err_t, fault)
    else:
        _judge_recoverable(t, out, fault)
    return t


def _judge_fatal(t: Trial, err: list[str], err_t: list[float], fault: float | None) -> None:
    t.latency_s = t.end_s
    # the first line from a survivor (its error or stall warning), or the verdict, that
    # names the culprit: when the diagnosis was out, as against when the job ended
    for when, line in zip(err_t, err):
        m = _EXC.match(line) or _WARN.match(line)
        survivor = m is not None and int(m[1]) != t.culprit
        if fault is not None and (survivor or line is t.verdict) and \
                re.search(rf"\brank {t.culprit}\b", line):
            t.named_s = when - fault
            break
    t.ended = (not t.timed_out and t.exit_code not in (0, None) and bool(t.verdict)
               and t.latency_s is not None and t.latency_s <= BOUND_S)
    t.names_culprit = bool(re.match(rf"pycomm\.launch: rank {t.culprit} ", t.verdict))
    names = [t.coll] + ([t.next_coll] if t.coll == "Bcast" else []) + \
        ([t.prev_coll] if t.transport == "rdma" and t.prev_coll else [])
    lines = [t.verdict] if t.verdict else []
    for line in err:
        m = _EXC.match(line) or _WARN.match(line)
        if m and int(m[1]) != t.culprit:
            lines.append(line)
    t.names_call = any(_word(n, line) for n in names for line in lines)
    t.evidence = "\n".join(lines)


def _judge_recoverable(t: Trial, out: list[str], fault: float | None) -> None:
    caught: dict[int, list] = {}
    last = None
    for line in out:
        m = _CAUGHT.match(line)
        if m:
            caught.setdefault(int(m[2]), []).append((int(m[3]), m[4], m[5]))
            last = max(last or 0.0, float(m[1]))
        s = _SILENT.match(line)
        if s:
            t.silent.append(int(s[1]))
    t.caught = {r: v for r, v in sorted(caught.items())}
    # a mismatched call that completed with no error in the next two calls is silent
    t.silent = [r for r in t.silent if r not in caught]
    done = {int(m[1]) for m in (re.match(r"^\[\d+\] CHAOS DONE rank=(\d+)$", x) for x in out)
            if m}
    raised = set(caught)
    # badarg: a rank that needs nothing from the culprit may complete (checked: no WRONG)
    everyone = raised == set(range(t.size)) or (
        t.kind == "badarg" and t.culprit in raised and done == set(range(t.size)))
    t.latency_s = (last - fault) if (last is not None and fault is not None) else None
    t.named_s = t.latency_s
    t.ended = (not t.timed_out and t.exit_code == 0 and everyone and not t.silent
               and t.latency_s is not None and t.latency_s <= BOUND_S)
    firsts = {r: v[0] for r, v in caught.items()}
    t.names_culprit = bool(firsts) and all(re.search(rf"\brank {t.culprit}\b", msg)
                                           for _, _, msg in firsts.values())
    t.names_call = bool(firsts) and all(_word(t.coll, msg) for _, _, msg in firsts.values())
    t.evidence = "\n".join(f"[{r}] call {c} {typ}: {msg}" for r, (c, typ, msg)
                           in sorted(firsts.items()))
    if t.exit_code != 0:
        t.notes.append(f"job exited {t.exit_code} after the recoverable fault")


# -- the table -----------------------------------------------------------------------------
COLUMNS = ("kind", "transport", "trials", "ended<=5s", "wrong", "silent", "leaks",
           "names culprit",
           "names call", "end s median", "end s max", "named s median")


def table(trials: list[Trial]) -> list[list[str]]:
    """One row per (kind, transport) and a total row."""
    groups: dict[tuple[str, str], list[Trial]] = {}
    for t in trials:
        groups.setdefault((t.kind, t.transport), []).append(t)
    order = {k: i for i, k in enumerate(rankmod.KINDS)}
    rows = []
    keys = sorted(groups, key=lambda g: (order.get(g[0], 99), g[1]))
    for key in [*keys, ("all", "all")]:
        ts = trials if key == ("all", "all") else groups[key]
        lat = [t.latency_s for t in ts if t.latency_s is not None]
        named = [t.named_s for t in ts if t.named_s is not None]
        n = len(ts)
        rows.append([key[0], key[1], str(n), f"{sum(t.ended for t in ts)}/{n}",
                     str(sum(t.wrong for t in ts)), str(sum(len(t.silent) for t in ts)),
                     str(sum(len(t.leaks) for t in ts)),
                     f"{sum(t.names_culprit for t in ts)}/{n}",
                     f"{sum(t.names_call for t in ts)}/{n}",
                     f"{statistics.median(lat):.2f}" if lat else "-",
                     f"{max(lat):.2f}" if lat else "-",
                     f"{statistics.median(named):.2f}" if named else "-"])
    return rows


def format_table(rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def describe(t: Trial) -> str:
    """One line naming the trial."""
    return (f"#{t.index} {t.kind}/{t.variant} {t.transport} n={t.size} culprit={t.culprit} "
            f"call={t.call} ({t.coll}, count {t.count}) seed={t.seed}")


def misses(t: Trial) -> list[str]:
    """Why trial ``t`` falls short, one reason per item (empty: all well)."""
    why = []
    if t.timed_out:
        why.append(f"still running after {HARD_LIMIT_S:.0f} s (killed)")
    if not t.ended:
        lat = "?" if t.latency_s is None else f"{t.latency_s:.2f} s"
        why.append(f"not ended with a named error within {BOUND_S:.0f} s (exit {t.exit_code}, "
                   f"latency {lat}, fault to exit "
                   f"{'?' if t.end_s is None else f'{t.end_s:.2f} s'})")
    if t.wrong:
        why.append(f"{t.wrong} wrong results")
    if t.silent:
        why.append(f"ranks {t.silent} completed the mismatched call and never raised")
    if t.leaks:
        why.append(f"leaks: {t.leaks}")
    if not t.names_culprit:
        why.append(f"culprit rank {t.culprit} not named")
    if not t.names_call:
        why.append(f"call {t.coll} not named")
    return why + t.notes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=70)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--transports", default="shm,tcp,rdma")
    p.add_argument("--sizes", default="3,4")
    p.add_argument("--kinds", default=",".join(rankmod.KINDS))
    p.add_argument("--json", help="write every trial's record to this file")
    p.add_argument("--only", metavar="I,J", help="run only these trials of the plan (its "
                   "--trials, --seed, --transports, --sizes and --kinds as when first run)")
    p.add_argument("--repeat", type=int, default=1, metavar="K",
                   help="run each (selected) trial K times, to see how often a miss recurs")
    p.add_argument("--logs", metavar="DIR", help="write each trial's output to DIR/trial<i>.log")
    p.add_argument("-q", "--quiet", action="store_true", help="no line per trial")
    args = p.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    if unknown := set(kinds) - set(rankmod.KINDS):
        p.error(f"unknown fault kinds {sorted(unknown)}")
    trials = plan(args.trials, args.seed, args.transports.split(","),
                  [int(s) for s in args.sizes.split(",")], kinds)
    if args.only:
        keep = {int(i) for i in args.only.split(",")}
        trials = [t for t in trials if t.index in keep]
    if args.repeat > 1:
        trials = [make_trial(t.index, t.kind, t.transport, t.size, t.culprit, t.call, t.seed)
                  for t in trials for _ in range(args.repeat)]
    start = time.time()
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    for t in trials:
        run_trial(t, log_dir=args.logs)
        if not args.quiet:
            why = misses(t)
            lat = "?" if t.latency_s is None else f"{t.latency_s:.2f}"
            named = "?" if t.named_s is None else f"{t.named_s:.2f}"
            print(f"{describe(t)}: exit {t.exit_code}, named {named} s, end {lat} s, "
                  f"{'ok' if not why else '; '.join(why)}", flush=True)
    took = time.time() - start
    print(f"\n{len(trials)} trials in {took:.0f} s, seed {args.seed}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(start))}\n")
    print(format_table(table(trials)))
    missed = [t for t in trials if not (t.names_culprit and t.names_call and t.ended)]
    if missed:
        print("\nMisses, with the text the rules looked at:")
        for t in missed:
            print(f"\n{describe(t)}\n  " + "\n  ".join(misses(t)))
            print("  verdict: " + (t.verdict or "(none)"))
            for line in t.evidence.splitlines()[:6]:
                print("  | " + line[:700])
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(t) for t in trials], indent=1))
    if any(t.timed_out for t in trials):
        return 2
    return 1 if any(t.wrong or t.leaks for t in trials) else 0


if __name__ == "__main__":
    sys.exit(main())
