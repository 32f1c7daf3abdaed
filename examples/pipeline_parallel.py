"""Pipeline parallel: layers in stages over the ranks, micro-batches, GPipe and 1F1B.

Rank s holds stage s, a run of consecutive layers of a numpy MLP. Each global batch is
cut into m micro-batches; a stage receives a micro-batch's activations from stage s-1
(``Irecv``, all posted when the step starts), runs its layers and sends the result to
stage s+1 (``Isend``); back-propagation sends the input gradients the other way.
Gradients accumulate over the micro-batches and every stage takes its optimizer step at
the end of the batch, so the result is exactly full-batch SGD.

Two schedules of the same work:

* **GPipe** (Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks
  using Pipeline Parallelism", NeurIPS, arXiv:1811.06965): every forward, then every
  backward. A stage keeps the activations of all m micro-batches.
* **1F1B** (PipeDream, Narayanan et al. 2019, "PipeDream: Generalized Pipeline
  Parallelism for DNN Training", SOSP; the flushed form of PipeDream-Flush / Megatron's
  schedule): stage s runs p-s-1 warm-up forwards, then alternates one forward and one
  backward, then drains; at most p-s micro-batches' activations are alive at once.

Both have the same bubble: with equal stages, each stage idles (p-1)/(m+p-1) of the step
(the pipeline filling and draining). The example measures each stage's busy time
(forward and backward compute) against the step's wall time, prints the bubble
fraction 1 - busy/step beside the formula, and the activations each schedule held at
peak. It asserts that both schedules' weights equal (rtol 1e-9) those of the same steps
run in one process on whole batches. With more ranks than cores (4 ranks on 2 cores)
a stage's busy time also contains the time it was not scheduled, so the measured
bubble is a lower bound there.

Run::

    python launch.py -n 4 examples/pipeline_parallel.py [--micro-batches 8] [--width 1024]
"""

from __future__ import annotations

import sys

import _training as C

import numpy as np  # noqa: E402  (after _training pins the BLAS threads)


def stage_layers(p: int, k: int) -> list[tuple[int, int]]:
    """(first, last) layer of each of ``p`` stages of a model of 1 + k*p + 1 layers.

    Stage s holds k hidden layers; stage 0 also the small input layer (64 -> width) and
    the last stage the small head (width -> 10), so the stages cost about the same.
    """
    out = []
    for s in range(p):
        first = 0 if s == 0 else 1 + k * s
        last = k * (s + 1) + (1 if s == p - 1 else 0)
        out.append((first, last))
    return out


def schedule(kind: str, s: int, p: int, m: int) -> list[tuple[str, int]]:
    """The order stage ``s`` of ``p`` runs its ``m`` forwards ("F", j) and backwards ("B", j)."""
    if kind == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m - 1, -1, -1)]
    warm = min(p - s - 1, m)
    ops = [("F", j) for j in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", j) for j in range(m - warm, m)]


def train(kind, args, data, dims, flat0, steps_batches, comm, mod):
    """Train with schedule ``kind``; return (this stage's params, times, peak activations).

    ``times[s]`` is step s's ``(wall, busy, waiting)`` seconds on this stage, timed from
    a barrier at the step's start to its optimizer step's end; waiting is the time spent
    in ``Wait`` for messages (the pipeline's communication, bubble included).
    """
    X, y = data[0], data[1]
    s, p, m = comm.rank, comm.size, args.micro_batches
    first, last = stage_layers(p, args.layers_per_stage)[s]
    span = C.Params.over(flat0, dims).span(first, last)
    params = flat0.copy()
    grads, acc, vel = (np.zeros_like(params) for _ in range(3))
    P, G = C.Params.over(params, dims), C.Params.over(grads, dims)
    width_in, width_out = dims[first], dims[last + 1]
    peak = 0
    times = []
    for batch in steps_batches:
        comm.Barrier()
        t_step = mod.Wtime()
        busy = wait = 0.0
        micro = np.array_split(batch, m)
        # every receive of the step posted up front, tags: j forward, m + j backward
        acts = [np.empty((len(mb), width_in)) for mb in micro] if s > 0 else None
        douts = [np.empty((len(mb), width_out)) for mb in micro] if s < p - 1 else None
        recv_f = [comm.Irecv(acts[j], s - 1, j) for j in range(m)] if s > 0 else None
        recv_b = [comm.Irecv(douts[j], s + 1, m + j) for j in range(m)] if s < p - 1 else None
        sends, caches, dlogits = [], {}, {}
        acc[span] = 0.0
        for op, j in schedule(kind, s, p, m):
            if op == "F":
                if s > 0:
                    t0 = mod.Wtime()
                    recv_f[j].Wait()
                    wait += mod.Wtime() - t0
                t0 = mod.Wtime()
                out, caches[j] = C.mlp_forward(P, acts[j] if s > 0 else X[micro[j]],
                                               first, last)
                if s == p - 1:
                    _, dlogits[j] = C.softmax_xent(out, y[micro[j]])
                busy += mod.Wtime() - t0
                if s < p - 1:
                    sends.append(comm.Isend(out, s + 1, j))
                peak = max(peak, sum(sum(x.nbytes + z.nbytes for x, z in c)
                                     for c in caches.values()))
            else:
                if s < p - 1:
                    t0 = mod.Wtime()
                    recv_b[j].Wait()
                    wait += mod.Wtime() - t0
                t0 = mod.Wtime()
                dout = douts[j] if s < p - 1 else dlogits.pop(j)
                dx = C.mlp_backward(P, G, caches.pop(j), dout, first, need_dx=s > 0)
                acc[span] += grads[span]
                busy += mod.Wtime() - t0
                if s > 0:
                    sends.append(comm.Isend(dx, s - 1, m + j))
        t0 = mod.Wtime()
        mod.Request.Waitall(sends)
        wait += mod.Wtime() - t0
        t0 = mod.Wtime()
        vel[span] *= args.momentum
        vel[span] -= args.lr / len(batch) * acc[span]
        params[span] += vel[span]
        busy += mod.Wtime() - t0
        times.append((mod.Wtime() - t_step, busy, wait))
    return params[span], times, peak


def main(argv=None) -> int:
    """Train with both schedules, check against one process, report; exit status."""
    def add(ap):
        ap.add_argument("--micro-batches", type=int, default=8, help="m (default 8)")
        ap.add_argument("--width", type=int, default=None, help="hidden width")
        ap.add_argument("--layers-per-stage", type=int, default=2, help="hidden layers each")
        ap.add_argument("--steps", type=int, default=None, help="SGD steps per schedule")
        ap.add_argument("--lr", type=float, default=0.02)
        ap.add_argument("--momentum", type=float, default=0.9)

    args = C.parse_args(__doc__.splitlines()[0], add, argv)
    args.width = args.width or (64 if args.small else 1024)
    args.steps = args.steps or (3 if args.small else 6)
    mod, comm = C.world()
    rank, p, m = comm.rank, comm.size, args.micro_batches
    data = C.load_data(args.seed, comm=comm)
    wire = C.WireCounter(comm)
    dims = [64] + [args.width] * (args.layers_per_stage * p + 1) + [10]
    flat0 = C.init_mlp(dims, args.seed)
    comm.Bcast(flat0, root=0)
    steps = C.full_batches(len(data[1]), args.batch_size, args.seed, args.steps)
    stages = stage_layers(p, args.layers_per_stage)
    if rank == 0:
        print(f"MLP {dims[0]}-{args.width}x{len(dims) - 2}-{dims[-1]} "
              f"({flat0.size} params) in {p} stages {stages}, batch {args.batch_size} in "
              f"{m} micro-batches of ~{args.batch_size // m} rows, {args.steps} steps "
              f"(first untimed)", flush=True)

    # every rank computes the reference at once (see train_data_parallel.py for why)
    ref, losses = C.sgd_reference(dims, flat0, data[0], data[1], steps, args.lr,
                                  args.momentum)
    ok = True
    rows = []
    formula = (p - 1) / (m + p - 1)
    for kind in ("gpipe", "1f1b"):
        wire.take()
        mine, times, peak = train(kind, args, data, dims, flat0, steps, comm, mod)
        sent, msgs = wire.take()
        span = C.Params.over(flat0, dims).span(*stages[rank])
        good, gap = C.close(mine, ref[span])
        every = comm.gather((good, gap, times, peak, sent), root=0)
        if rank == 0:
            ok &= C.check(rank, all(e[0] for e in every),
                          f"{kind}: every stage's weights after {args.steps} steps equal the "
                          f"single-process run's (max rel. diff {max(e[1] for e in every):.2g})")
            # a step lasts until its slowest stage is done; a stage's bubble is the part
            # of that it was not computing. Medians over the steps after the first.
            t = np.array([e[2] for e in every])[:, 1:, :]  # stage, step, (wall, busy, wait)
            wall = t[:, :, 0].max(axis=0)
            step_ms = float(np.median(wall)) * 1e3
            bubbles = [float(np.median(1 - t[r, :, 1] / wall)) for r in range(p)]
            waiting = float(np.median(t[:, :, 2].mean(axis=0) / wall))
            act_bytes = 2 * (len(steps[0]) * args.width * 8) * (p - 1) / p  # per rank, F + B
            rows.append((kind, step_ms, bubbles, waiting, [e[3] for e in every],
                         np.mean([e[4] for e in every]) / args.steps, act_bytes))
    if rank == 0:
        print(f"single-process loss {losses[0]:.1f} -> {losses[-1]:.1f} (summed over a batch)")
        print(f"{'schedule':<8} {'step ms':>8} {'bubble per stage (1 - busy/step)':>34} "
              f"{'mean':>6} {'(p-1)/(m+p-1)':>14} {'waiting':>8} {'peak acts/stage':>22} "
              f"{'sent/rank/step':>15}")
        for kind, step_ms, bubbles, waiting, peaks, sent, act_bytes in rows:
            print(f"{kind:<8} {step_ms:8.1f} {' '.join(f'{b:5.1%}' for b in bubbles):>34} "
                  f"{np.mean(bubbles):6.1%} {formula:14.1%} {waiting:8.1%} "
                  f"{' '.join(f'{x / 2**20:.1f}' for x in peaks):>17} MiB "
                  f"{C.mib(sent):>15}")
        print(f"(medians over the steps after the first; waiting: the share of a step spent "
              f"in Wait for messages, mean over stages, the pipeline's communication share, "
              f"its bubble included; bytes formula: activations forward + gradients back, "
              f"2·B·width·8·(p-1)/p = {C.mib(rows[0][6])} per rank per step)", flush=True)
        ok &= C.check(rank, all(np.isclose(sent, want) for *_, sent, want in rows),
                      "bytes sent per rank per step equal 2·B·width·8·(p-1)/p")
    return C.finish(comm, ok)


if __name__ == "__main__":
    sys.exit(main())
