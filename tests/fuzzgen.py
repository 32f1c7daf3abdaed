"""Differential fuzzing of pycomm's collectives and point-to-point calls (2026-11-26).

A *case* is a seed. Every rank of a world runs :func:`fuzz_task` with the same seed: a
program random generator, seeded by the case alone, draws the same sequence of steps on
every rank (collective, communicator, dtype, op, count, root, algorithm, IN_PLACE, buffer
offsets, blocking or not); each rank's input of a step comes from a generator seeded by
(seed, step, world rank, part), so every rank rebuilds every other rank's input and computes
the numpy reference of its own result. A rank returns, per step, an outcome record; the
driver (:func:`check_case`) then also compares the ranks' records with each other: the
same error on every rank or none, and bit-identical all-reduce results on every rank of a
communicator.

The parts: :mod:`fuzzplan` draws the program (communicators, each step's parameters),
:mod:`fuzzref` makes the inputs and the numpy references and says how exact a result
must be, :mod:`fuzzcoll` posts the buffer collectives and checks them, :mod:`fuzzcalls`
runs the point-to-point, object and pycomm.MPI steps; this module runs a case on a rank
(:func:`fuzz_task`), checks the ranks' records together (:func:`check_case`) and drives
replays and campaigns. Importing it registers all of them with cloudpickle by value, so
that the ranks never import them.

Run a campaign: ``python tests/fuzzgen.py --minutes 30`` (one world at a time, at most
8 ranks). ``python tests/fuzzgen.py --replay SIZE TRANSPORT SEED [--steps N]`` reruns
one case and prints its failures. Failures are appended to ``--log`` as JSON lines.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import traceback

import cloudpickle
import numpy as np

import fuzzcalls
import fuzzcoll
import fuzzplan
import fuzzref
import pycomm
from fuzzcalls import exec_mpi, exec_mpi_vector, exec_objects, exec_p2p
from fuzzcoll import Buffers, exec_coll, run_checks
from fuzzplan import (COPYING, KIB, MAX_BYTES, NB_OK, REDUCING, build_comms, comm_specs,
                      hosts_spec, plan_step)
from fuzzref import affine, user_sum

# fuzz_task travels to the ranks by value (the test module registers this module, a
# campaign __main__); so must the modules it calls into, which the ranks cannot import
for _module in (fuzzref, fuzzplan, fuzzcoll, fuzzcalls):
    cloudpickle.register_pickle_by_value(_module)

# environments the ranks start with: protocol thresholds moved so that small and odd
# counts cross them (segments that are no multiple of the item size, direct reads of a
# few bytes, slots of 256 B, 4 KiB rings)
VARIANTS = {
    "": {},
    "tiny": {"PYCOMM_EAGER_LIMIT": "64", "PYCOMM_SEGMENT_BYTES": "24",
             "PYCOMM_RING_SEGMENT_BYTES": "24", "PYCOMM_HALVING_SEGMENT_BYTES": "24",
             "PYCOMM_SHM_RING_BYTES": "4096"},
    "odd": {"PYCOMM_EAGER_LIMIT": "1000", "PYCOMM_SEGMENT_BYTES": "100",
            "PYCOMM_RING_SEGMENT_BYTES": "52", "PYCOMM_HALVING_SEGMENT_BYTES": "36",
            "PYCOMM_SHM_COLL_BYTES": "256", "PYCOMM_SCRATCH_KEEP_BYTES": "0"},
    "direct": {"PYCOMM_SHM_DIRECT_BYTES": "1", "PYCOMM_SHM_COLL_BYTES": "64"},
    "noslots": {"PYCOMM_SHM_COLL_BYTES": "0", "PYCOMM_SHM_RING_BYTES": "8192"},
}


def _digest(arr):
    return hashlib.blake2b(np.ascontiguousarray(arr).view(np.uint8).tobytes(),
                           digest_size=8).hexdigest()


def fuzz_task(seed, steps, colls=None, max_bytes=8 * 1024 * KIB):
    """On a rank: run case ``seed``; return its per-step records."""
    MAX_BYTES[0] = max_bytes
    comm = pycomm.COMM_WORLD
    size, me = comm.size, comm.rank
    prog = np.random.default_rng([seed, 0xF022])
    local = np.random.default_rng([seed, 0xF022, me])
    colls = colls or (list(REDUCING) * 2 + list(COPYING) + ["barrier", "p2p", "objects",
                                                             "nb_group", "p2p",
                                                             "mpi"])
    specs = comm_specs(prog, size)
    hrng = np.random.default_rng([seed, 0x4057])      # same on every rank
    base = list(specs)                                 # what plan_step draws from
    if size >= 2:
        specs.append(hosts_spec(hrng, size))
    comms = build_comms(comm, specs)
    user_ops = {"AFFINE": pycomm.Op.Create(affine, commute=False),
                "USER_SUM": pycomm.Op.Create(user_sum, commute=True)}
    bufs = Buffers(local)
    mpi_state = {}
    records = []
    try:
        for step in range(steps):
            coll = str(prog.choice(colls))
            if coll == "nb_group":
                k = int(prog.integers(2, 5))
                plans = [plan_step(prog, size, base, [c for c in colls if c in NB_OK])
                         for _ in range(k)]
            else:
                plans = [plan_step(prog, size, base, [coll])]
            for p in plans:                 # a fifth of the calls on the emulated hosts
                if size >= 2 and hrng.random() < 0.2 and p["coll"] != "mpi":
                    p["ci"] = len(specs) - 1
                if p["coll"] == "objects":
                    p["objop"] = str(hrng.choice(["", "concat", "maxloc", "array", "bxor"]))
                if p["coll"] == "reduce_scatter":
                    p["nocounts"] = bool(hrng.random() < 0.3)
                if p["coll"] == "p2p":      # longer receive buffers, probes
                    p["extra"] = int(hrng.choice([0, 0, 1, 7, 9000]))
                    p["probe"] = bool(hrng.random() < 0.3)
                if p["coll"] == "mpi" and hrng.random() < 0.4:     # strided datatypes
                    p["which"] = str(hrng.choice(["BcastVec", "AllreduceVec", "GatherVec"]))
            rec = {"step": step, "plans": plans, "errs": [], "exc": None, "digests": []}
            records.append(rec)
            posted = []
            bufs.release()
            for j, p in enumerate(plans):
                c = comms[p["ci"]]
                if c == pycomm.COMM_NULL or c is None:
                    continue
                members = specs[p["ci"]][1][me]
                sub = step * 10 + j
                try:
                    if p["coll"] == "p2p":
                        rec["errs"] += exec_p2p(c, members, p, seed, sub, local)
                    elif p["coll"] == "objects":
                        rec["errs"] += exec_objects(c, members, p, seed, sub)
                    elif p["coll"] == "mpi" and p["which"].endswith("Vec"):
                        rec["errs"] += exec_mpi_vector(p, seed, sub)
                    elif p["coll"] == "mpi":
                        rec["errs"] += exec_mpi(p, seed, sub, mpi_state)
                    else:
                        # a blocking call may meet its nonblocking twin on other ranks
                        # (in a group of outstanding nonblocking calls too: a blocking
                        # call on one rank among another communicator's pending ones)
                        nb = local.random() < (0.8 if coll == "nb_group" else 0.25)
                        req, checks, guards = exec_coll(c, members, p, seed, sub, bufs,
                                                        user_ops, nb)
                        posted.append((req, checks, guards, p, j, members))
                except pycomm.CommError as exc:
                    rec["exc"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            try:
                order = local.permutation(len(posted)) if posted else []
                if coll == "nb_group" and local.random() < 0.3:
                    pycomm.Request.Waitall([x[0] for x in posted if x[0] is not None])
                else:
                    for i in order:
                        if posted[i][0] is not None:
                            posted[i][0].Wait()
            except pycomm.CommError as exc:
                rec["exc"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                for x in posted:                 # every request ends before the next step
                    try:
                        if x[0] is not None:
                            x[0].Wait()
                    except pycomm.CommError:
                        pass
                continue
            bufs.release()
            for req, checks, guards, p, j, members in posted:
                rec["errs"] += run_checks(checks, guards, p)
                if p["coll"] == "allreduce":
                    rec["digests"].append((j, tuple(members), _digest(checks[0][1])))
    finally:
        for op in user_ops.values():
            op.Free()
        if mpi_state:
            mpi_state["op"].Free()
            mpi_state["T2"].Free()
        for c in comms[1:]:
            if c is not None and c != pycomm.COMM_NULL:
                c.Free()
    return records


# -- the driver ----------------------------------------------------------------------------

def check_case(per_rank, specs_size=None) -> list[str]:
    """Problems of one case from every rank's records: wrong results, uneven errors,
    all-reduce results that differ between ranks."""
    problems = []
    nsteps = max(len(x) for x in per_rank)
    for s in range(nsteps):
        recs = [x[s] if s < len(x) else None for x in per_rank]
        for r, rec in enumerate(recs):
            if rec is None:
                continue
            for e in rec["errs"]:
                problems.append(f"step {s} rank {r}: WRONG {e} :: {_brief(rec['plans'])}")
            if rec["exc"] and not _expected_refusal(rec["exc"]):
                problems.append(f"step {s} rank {r}: ERROR {rec['exc']} :: "
                                f"{_brief(rec['plans'])}")
        excs = {r: rec["exc"] for r, rec in enumerate(recs) if rec is not None}
        # allreduce digests: every rank of a communicator the same bits
        seen = {}
        for r, rec in enumerate(recs):
            if rec is None or rec["exc"]:
                continue
            for j, members, d in rec["digests"]:
                seen.setdefault((j, tuple(members)), {}).setdefault(d, []).append(r)
        for key, ds in seen.items():
            if len(ds) > 1:
                problems.append(f"step {s}: ALLREDUCE BITS DIFFER between ranks {ds} "
                                f":: {_brief([recs[ds[next(iter(ds))][0]]['plans'][key[0]]])}")
        _ = excs
    return problems


def _expected_refusal(msg: str) -> bool:
    return msg.startswith("ArgumentError") and ("algorithm" in msg or "not defined" in msg
                                                 or "needs" in msg or "requires" in msg)


def _brief(plans):
    keys = ("coll", "ci", "dtype", "op", "count", "root", "alg", "inplace", "mode")
    return "; ".join(",".join(f"{k}={p[k]}" for k in keys if k in p) for p in plans)


# the tiny segments make a MiB take seconds: smaller buffers there
# (odd: 36-byte halving segments make a 1 MiB reduce-scatter 29k messages, minutes)
VARIANT_MAX_BYTES = {"tiny": 96 * KIB, "odd": 128 * KIB}


def start_pool(size, transport, variant="", timeout=90.0):
    """A Pool whose ranks start with the variant's environment."""
    import os
    env = VARIANTS[variant]
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return pycomm.Pool(size, transport=transport, timeout=timeout)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def replay(size, transport, seed, steps, colls=None, timeout=120.0, variant="",
           max_bytes=None):
    pool = start_pool(size, transport, variant, timeout)
    try:
        res = pool.run(fuzz_task, seed, steps, colls,
                       max_bytes or VARIANT_MAX_BYTES.get(variant, 8 * 1024 * KIB))
        return check_case(res), res
    finally:
        pool.close()


def campaign(minutes, log, seeds_from=0, steps=12, worlds=None, variants=("",)):
    import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    worlds = worlds or [(n, t) for n in (2, 3, 4, 5, 6, 7, 8) for t in ("shm", "tcp")] + \
        [(n, "rdma") for n in (2, 3, 4, 5)]
    worlds = [(n, t, v) for v in variants for n, t in worlds
              if v in ("", "tiny", "odd") or t == "shm"]      # direct, noslots: shm's
    end = time.time() + minutes * 60
    seed = seeds_from
    stats = {"cases": 0, "steps": 0, "problems": 0, "errors": {}}
    per_world = max(1.0, minutes * 60 / len(worlds))
    rounds = 0
    while time.time() < end:
        for size, transport, variant in worlds:
            if time.time() >= end:
                break
            try:
                pool = start_pool(size, transport, variant)
            except Exception as exc:
                print("pool start failed", size, transport, exc, flush=True)
                continue
            wend = min(end, time.time() + per_world / (1 if rounds else 2))
            try:
                while time.time() < wend:
                    seed += 1
                    try:
                        res = pool.run(fuzz_task, seed, steps, None,
                                       VARIANT_MAX_BYTES.get(variant, 8 * 1024 * KIB),
                                       timeout=90.0)
                        probs = check_case(res)
                    except pycomm.CommError as exc:
                        probs = [f"TASK FAILED {type(exc).__name__}: "
                                 f"{str(exc)[:2000]}"]
                        res = None
                    stats["cases"] += 1
                    stats["steps"] += steps
                    if res:
                        for rec in res[0]:
                            if rec["exc"]:
                                k = rec["exc"][:90]
                                stats["errors"][k] = stats["errors"].get(k, 0) + 1
                    if probs:
                        stats["problems"] += 1
                        with open(log, "a") as f:
                            f.write(json.dumps({"size": size, "transport": transport,
                                                "variant": variant,
                                                "seed": seed, "steps": steps,
                                                "problems": probs[:20]}) + "\n")
                        print(f"FAIL n={size} {transport} {variant} seed={seed}: {probs[0][:300]}",
                              flush=True)
                        if res is None:
                            break               # the pool is broken: a new one
            finally:
                try:
                    pool.close()
                except Exception:
                    traceback.print_exc()
            print(f"{time.strftime('%H:%M:%S')} n={size} {transport} {variant}: {stats['cases']} cases,"
                  f" {stats['problems']} failing", flush=True)
        rounds += 1
    print(json.dumps(stats, indent=1))
    return stats


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--log", default="/tmp/fuzz_failures.jsonl")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--replay", nargs=3)
    ap.add_argument("--variant", default="")
    ap.add_argument("--max-bytes", type=int, default=None)
    ap.add_argument("--variants", default="", help="comma list of VARIANTS keys")
    ap.add_argument("--worlds", default=None, help="e.g. 3:shm,5:tcp")
    a = ap.parse_args()
    if a.replay:
        import cloudpickle
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        probs, _ = replay(int(a.replay[0]), a.replay[1], int(a.replay[2]), a.steps,
                          variant=a.variant, max_bytes=a.max_bytes)
        print("\n".join(probs) or "no problem")
    else:
        worlds = None
        if a.worlds:
            worlds = [(int(w.split(":")[0]), w.split(":")[1]) for w in a.worlds.split(",")]
        campaign(a.minutes, a.log, a.seed, a.steps, worlds,
                 tuple(a.variants.split(",")) if a.variants else ("",))
