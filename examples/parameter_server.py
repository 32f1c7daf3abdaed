"""Parameter server: server ranks hold parameter shards, workers push gradients, pull weights.

The classic parameter server (Li et al. 2014, "Scaling Distributed Machine Learning with
the Parameter Server", OSDI) and its modern form BytePS (Jiang et al. 2020, "A Unified
Architecture for Accelerating Distributed DNN Training in Heterogeneous GPU/CPU
Clusters", OSDI): the flat parameter vector is cut into S contiguous shards, one per
server rank; each of the W worker ranks computes a gradient on its part of the batch,
*pushes* each shard of it to that shard's server (``Isend``) and *pulls* the updated
shard back (``Irecv``). Only point-to-point messages; the servers run the optimizer.

Two consistency modes:

* **synchronous**: a server waits for every worker's push, sums them, takes one SGD step
  and answers every pull: exactly full-batch SGD, checked against one process (rtol 1e-9);
* **bounded-staleness asynchronous** (stale synchronous parallel, Ho et al. 2013, the
  "bounded delay" consistency of Li et al. 2014): a server applies each push as it
  arrives (``Irecv`` from ``ANY_SOURCE``) and answers that worker with the current
  weights at once, unless the worker is more than ``--staleness`` pushes ahead of the
  slowest one, in which case its answer waits. The result is not bit-reproducible, so the
  check is the bound itself (never exceeded) and the test accuracy.

The same job (same model, batches and steps) then runs as plain data parallel with an
``Allreduce`` on all p ranks. The example prints step time, the communication share and
the bytes each rank sent per step, beside the formulas: ring all-reduce 2(p-1)/p·N sent
per rank; parameter server N pushed per worker and W·N/S pulled from each server.
BytePS's argument is the bottleneck link: with as many servers as workers a worker's
traffic is 2N (N out, N in) against the all-reduce's 4(p-1)/p·N.

Run::

    python launch.py -n 4 examples/parameter_server.py [--servers 2] [--staleness 2]
"""

from __future__ import annotations

import sys

import _training as C

import numpy as np  # noqa: E402  (after _training pins the BLAS threads)

PUSH, PULL = 1, 2


def shard_bounds(n: int, servers: int) -> list[tuple[int, int]]:
    """[lo, hi) of each server's shard of a flat vector of ``n`` parameters."""
    cuts = np.linspace(0, n, servers + 1).round().astype(int)
    return [(int(cuts[j]), int(cuts[j + 1])) for j in range(servers)]


def worker(args, dims, flat0, data, steps, comm, mod, roles, asynchronous):
    """Train as worker ``roles['w']``; return (params, per-step {"step", "comm"} seconds)."""
    X, y = data[0], data[1]
    W, w = roles["W"], roles["w"]
    params = flat0.copy()
    grads = np.zeros_like(params)
    P, G = C.Params.over(params, dims), C.Params.over(grads, dims)
    clock = C.Clock(mod.Wtime)
    times = []
    for batch in steps:                 # no barrier: the servers are not in step with us
        clock.total.clear()
        t0 = mod.Wtime()
        rows = np.array_split(batch, W)[w]
        out, cache = C.mlp_forward(P, X[rows])
        _, d = C.softmax_xent(out, y[rows])
        C.mlp_backward(P, G, cache, d)
        with clock("comm"):
            reqs = [comm.Isend(grads[lo:hi], srv, PUSH)
                    for srv, (lo, hi) in zip(roles["servers"], roles["bounds"])]
            reqs += [comm.Irecv(params[lo:hi], srv, PULL)
                     for srv, (lo, hi) in zip(roles["servers"], roles["bounds"])]
            mod.Request.Waitall(reqs)
        times.append({"step": mod.Wtime() - t0, **clock.total})
    return params, times


def server(args, flat0, steps, comm, mod, roles, asynchronous):
    """Serve shard ``roles['j']`` for every push of every worker; return (shard, stats)."""
    lo, hi = roles["bounds"][roles["j"]]
    workers, W = roles["workers"], roles["W"]
    shard = flat0[lo:hi].copy()
    vel = np.zeros_like(shard)
    T = len(steps)
    lr_scale = args.lr / args.batch_size          # every push is a sum over its rows
    stats = {"max_gap": 0, "staleness": []}
    if not asynchronous:
        bufs = [np.empty_like(shard) for _ in workers]
        for _ in range(T):
            mod.Request.Waitall([comm.Irecv(b, src, PUSH) for b, src in zip(bufs, workers)])
            total = np.sum(bufs, axis=0)          # worker order: deterministic
            vel *= args.momentum
            vel -= lr_scale * total
            shard += vel
            mod.Request.Waitall([comm.Isend(shard, dst, PULL) for dst in workers])
        return shard, stats
    # bounded staleness: apply each push on arrival; answer unless too far ahead
    buf = np.empty_like(shard)
    pushes = dict.fromkeys(workers, 0)
    sent_version = dict.fromkeys(workers, 0)      # updates applied when w last pulled
    version = 0
    waiting: list[int] = []
    sends = []
    status = mod.Status()
    for _ in range(T * W):
        comm.Recv(buf, mod.ANY_SOURCE, PUSH, status=status)
        src = status.source
        stats["staleness"].append(version - sent_version[src])
        vel *= args.momentum
        vel -= lr_scale * buf                     # a push is 1/W of a batch: W of them
                                                  # make about one synchronous step
        shard += vel
        version += 1
        pushes[src] += 1
        waiting.append(src)
        slowest = min(pushes.values())
        for dst in list(waiting):
            gap = pushes[dst] - slowest
            if gap <= args.staleness or pushes[dst] == T:
                stats["max_gap"] = max(stats["max_gap"], gap if pushes[dst] < T else 0)
                waiting.remove(dst)
                sent_version[dst] = version
                sends.append(comm.Isend(shard.copy(), dst, PULL))   # shard moves on
        sends = [r for r in sends if not r.Test()]
    mod.Request.Waitall(sends)
    return shard, stats


def allreduce_version(args, dims, flat0, data, steps, comm, mod):
    """The same job as plain data parallel on all ranks; returns (params, per-step times)."""
    X, y = data[0], data[1]
    params = flat0.copy()
    grads, vel = np.zeros_like(params), np.zeros_like(params)
    P, G = C.Params.over(params, dims), C.Params.over(grads, dims)
    clock = C.Clock(mod.Wtime)
    times = []
    for batch in steps:
        comm.Barrier()                  # each step timed on its own
        clock.total.clear()
        t0 = mod.Wtime()
        rows = np.array_split(batch, comm.size)[comm.rank]
        out, cache = C.mlp_forward(P, X[rows])
        _, d = C.softmax_xent(out, y[rows])
        C.mlp_backward(P, G, cache, d)
        with clock("comm"):
            comm.Allreduce(mod.IN_PLACE, grads, op=mod.SUM)
        vel *= args.momentum
        vel -= args.lr / len(batch) * grads
        params += vel
        times.append({"step": mod.Wtime() - t0, **clock.total})
    return params, times


def main(argv=None) -> int:
    """Run PS sync, PS async and the all-reduce version; check; report; exit status."""
    def add(ap):
        ap.add_argument("--servers", type=int, default=None, help="S (default p // 2)")
        ap.add_argument("--staleness", type=int, default=2, help="async bound (pushes)")
        ap.add_argument("--width", type=int, default=None, help="hidden width")
        ap.add_argument("--steps", type=int, default=None, help="SGD steps per mode")
        ap.add_argument("--lr", type=float, default=0.05)
        ap.add_argument("--momentum", type=float, default=0.9)
        ap.add_argument("--min-accuracy", type=float, default=None,
                        help="test accuracy every mode must reach")

    args = C.parse_args(__doc__.splitlines()[0], add, argv)
    mod, comm = C.world()
    rank, p = comm.rank, comm.size
    if p < 2:
        raise SystemExit("a parameter server needs at least 2 ranks (1 server, 1 worker)")
    S = args.servers or max(1, p // 2)
    args.width = args.width or (64 if args.small else 512)
    args.steps = args.steps or (12 if args.small else 33)
    args.min_accuracy = args.min_accuracy or (0.7 if args.small else 0.9)
    W = p - S
    data = C.load_data(args.seed, comm=comm)
    wire = C.WireCounter(comm)
    dims = [64, args.width, args.width, 10]
    flat0 = C.init_mlp(dims, args.seed)
    comm.Bcast(flat0, root=0)
    n = flat0.size
    steps = C.full_batches(len(data[1]), args.batch_size, args.seed, args.steps)
    roles = {"W": W, "workers": list(range(W)), "servers": list(range(W, p)),
             "bounds": shard_bounds(n, S)}
    is_worker = rank < W
    if is_worker:
        roles["w"] = rank
    else:
        roles["j"] = rank - W
    if rank == 0:
        print(f"MLP {'-'.join(map(str, dims))}: N = {n} params ({C.mib(8 * n)}), {W} workers "
              f"(ranks 0..{W - 1}) + {S} servers (ranks {W}..{p - 1}); batch "
              f"{args.batch_size}, {args.steps} steps (first untimed), async staleness "
              f"bound {args.staleness}", flush=True)
    ref, losses = C.sgd_reference(dims, flat0, data[0], data[1], steps, args.lr,
                                  args.momentum)
    ok = True
    rows = []

    for mode in ("PS sync", "PS async"):
        asynchronous = mode == "PS async"
        comm.Barrier()
        wire.take()
        if is_worker:
            params, times = worker(args, dims, flat0, data, steps, comm, mod, roles,
                                   asynchronous)
            shard, stats = None, None
        else:
            shard, stats = server(args, flat0, steps, comm, mod, roles, asynchronous)
            params, times = None, None
        comm.Barrier()
        sent, _ = wire.take()
        every = comm.gather((params, shard, stats, times, sent), root=0)
        if rank != 0:
            continue
        joined = np.concatenate([e[1] for e in every[W:]])   # the servers' final shards
        acc = C.accuracy(C.mlp_forward(C.Params.over(joined, dims), data[2])[0], data[3])
        if not asynchronous:
            good = all(C.close(e[0], ref)[0] for e in every[:W]) and C.close(joined, ref)[0]
            gap = max(C.close(e[0], ref)[1] for e in every[:W])
            ok &= C.check(rank, good, f"{mode}: servers' shards and every worker's weights "
                          f"equal the single-process run's (max rel. diff {gap:.2g})")
        else:
            max_gap = max(e[2]["max_gap"] for e in every[W:])
            stale = [s for e in every[W:] for s in e[2]["staleness"]]
            ok &= C.check(rank, max_gap <= args.staleness,
                          f"{mode}: no worker ran more than {args.staleness} pushes ahead "
                          f"of the slowest (largest gap seen {max_gap}); updates applied "
                          f"between a worker's pull and its next push: mean "
                          f"{np.mean(stale):.2f}, max {max(stale)}")
        ok &= C.check(rank, acc >= args.min_accuracy,
                      f"{mode}: test accuracy {acc:.3f} >= {args.min_accuracy}")
        wsent = np.mean([e[4] for e in every[:W]]) / len(steps)
        ssent = np.mean([e[4] for e in every[W:]]) / len(steps)
        med = C.step_medians([e[3] for e in every[:W]])
        rows.append((mode, med["step"], med["comm"], wsent, ssent, acc))

    wire.take()
    params, times = allreduce_version(args, dims, flat0, data, steps, comm, mod)
    sent, _ = wire.take()
    every = comm.gather((C.close(params, ref), times, sent), root=0)
    if rank == 0:
        acc = C.accuracy(C.mlp_forward(C.Params.over(params, dims), data[2])[0], data[3])
        ok &= C.check(rank, all(e[0][0] for e in every),
                      f"all-reduce version: weights equal the single-process run's (max rel. "
                      f"diff {max(e[0][1] for e in every):.2g}), test accuracy {acc:.3f}")
        ar_sent = np.mean([e[2] for e in every]) / len(steps)
        med = C.step_medians([e[1] for e in every])
        rows.append((f"allreduce({p})", med["step"], med["comm"], ar_sent, None, acc))
        alg = comm.chosen_algorithm("allreduce", 8 * n)
        print(f"{'mode':<13} {'step ms':>8} {'comm ms':>8} {'share':>6} "
              f"{'sent/worker/step':>17} {'formula':>9} {'sent/server/step':>17} "
              f"{'formula':>9} {'acc':>6}")
        for mode, step_ms, comm_ms, wsent, ssent, acc in rows:
            if ssent is None:
                wform, sform, stext = C.allreduce_bytes(alg, 8 * n, p), None, "-"
            else:
                wform, sform = 8 * n, 8 * n * W / S
                stext = f"{C.mib(ssent):>17} {C.mib(sform):>9}"
            print(f"{mode:<13} {step_ms * 1e3:8.1f} {comm_ms * 1e3:8.1f} "
                  f"{comm_ms / step_ms:6.1%} {C.mib(wsent):>17} {C.mib(wform):>9} "
                  f"{stext:>27} {acc:6.3f}")
        print(f"(formulas, N = {C.mib(8 * n)}: PS worker pushes N, server pulls W·N/S to "
              f"workers; all-reduce ({alg}) "
              f"{'log2(p)·N' if alg == 'recursive_doubling' else '2(p-1)/p·N'} per rank. "
              f"Per-link traffic, in + out: PS worker 2N = {C.mib(16 * n)}, PS server "
              f"2W·N/S = {C.mib(16 * n * W / S)}, ring all-reduce 4(p-1)/p·N = "
              f"{C.mib(2 * C.ring_allreduce_bytes(8 * n, p))}. Medians over the steps after the "
              f"first: step ms, the slowest worker's; comm ms, push + pull (or all-reduce), "
              f"the mean over workers)", flush=True)
        ok &= C.check(rank, all(np.isclose(r[3], 8 * n) for r in rows[:2])
                      and all(np.isclose(r[4], 8 * n * W / S) for r in rows[:2])
                      and np.isclose(rows[2][3], C.allreduce_bytes(alg, 8 * n, p)),
                      "measured bytes equal the formulas (PS: N per worker, W·N/S per "
                      "server; all-reduce: the chosen algorithm's)")
    return C.finish(comm, ok)


if __name__ == "__main__":
    sys.exit(main())
