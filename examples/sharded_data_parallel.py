"""Sharded data parallel, ZeRO stages 1 and 2: optimizer state and gradients split over ranks.

ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC20, arXiv:1910.02054) removes data parallelism's redundancy: with
plain data parallel every rank keeps the whole gradient and the whole optimizer state
(Adam: two moments per parameter). Rank r of p instead owns one contiguous 1/p of the
flat parameter vector:

* **stage 1** (P_os): the whole gradient is computed as usual, then
  ``Reduce_scatter_block`` leaves each rank the batch-summed gradient of its own shard;
  Adam updates only that shard with moments kept for it alone; ``Allgather`` puts the
  updated shards back together on every rank;
* **stage 2** (P_os+g): the gradient is never held whole: back-propagation writes each
  layer's gradient into one scratch buffer of the largest layer's size and, as soon as the
  layer is done, ``Reduce_scatter`` (with each rank's count the overlap of the layer with
  its shard) sends every part to its owner; then Adam and ``Allgather`` as in stage 1.

Reduce-scatter plus all-gather move 2(p-1)/p·N per rank, the same as the all-reduce of
plain data parallel (the paper's section 7). The example trains an MLP on digits with
Adam three ways (plain, stage 1, stage 2) from the same weights, asserts that all three
equal (rtol 1e-9) the same steps run in one process on whole batches, and prints per
rank: the training state's bytes against the formula (float64 here, so per parameter
8 for weights, 8 for gradients, 16 for Adam's moments; the paper's mixed-precision
counts are 2 + 2 + 12), the peak of all memory allocated during training
(``tracemalloc``, which sees numpy's buffers, activations and pycomm's scratch
included), the step time, the communication share and the bytes sent.

Run::

    python launch.py -n 4 examples/sharded_data_parallel.py [--width 1024] [--steps 6]
"""

from __future__ import annotations

import sys
import tracemalloc
from types import SimpleNamespace

import _training as C

import numpy as np  # noqa: E402  (after _training pins the BLAS threads)


class Adam:
    """Adam (Kingma & Ba 2015) over a slice of a flat vector; its two moments are the state."""

    def __init__(self, n: int, lr: float, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8):
        self.m, self.v = np.zeros(n), np.zeros(n)
        self.lr, self.b1, self.b2, self.eps, self.t = lr, b1, b2, eps, 0

    def step(self, w: np.ndarray, g: np.ndarray) -> None:
        """Update ``w`` in place from the mean gradient ``g`` (both this state's length)."""
        self.t += 1
        self.m *= self.b1
        self.m += (1 - self.b1) * g
        self.v *= self.b2
        self.v += (1 - self.b2) * g * g
        mhat = self.m / (1 - self.b1 ** self.t)
        vhat = self.v / (1 - self.b2 ** self.t)
        w -= self.lr * mhat / (np.sqrt(vhat) + self.eps)


def aliased_grads(dims, scratch: np.ndarray):
    """Gradient views of every layer over one shared scratch (ZeRO-2's gradient bucket).

    Layer i's gradient is sent away before back-prop writes layer i-1's, so all layers can
    share the largest layer's space.
    """
    W, b = [], []
    for din, dout in zip(dims[:-1], dims[1:]):
        W.append(scratch[:din * dout].reshape(din, dout))
        b.append(scratch[din * dout:din * dout + dout])
    return SimpleNamespace(W=W, b=b)


def reference(args, dims, flat0, data, steps):
    """The single-process Adam run on whole batches; returns the final flat weights."""
    w = flat0.copy()
    g = np.zeros_like(w)
    P, G = C.Params.over(w, dims), C.Params.over(g, dims)
    opt = Adam(w.size, args.lr)
    for batch in steps:
        out, cache = C.mlp_forward(P, data[0][batch])
        _, d = C.softmax_xent(out, data[1][batch])
        C.mlp_backward(P, G, cache, d)
        opt.step(w, g / len(batch))
    return w


def train(stage, args, dims, flat0, data, steps, comm, mod):
    """Train with ``stage`` 0 (plain data parallel), 1 or 2; return results of this rank.

    Returns a dict: ``params`` (the first N of the padded vector), ``state_bytes`` (what
    the training keeps between steps: weights, gradients, optimizer moments), ``peak``
    (tracemalloc's peak during training), ``times`` (per step ``{"step", "comm"}``
    seconds, for :func:`_training.step_medians`).
    """
    X, y = data[0], data[1]
    rank, p = comm.rank, comm.size
    n = flat0.size
    c = -(-n // p)                                  # shard length; the vector is padded
    mine = slice(rank * c, (rank + 1) * c)
    tracemalloc.start()
    params = np.zeros(c * p)
    params[:n] = flat0
    P = C.Params.over(params, dims)
    clock = C.Clock(mod.Wtime)
    if stage == 0:
        grads = np.zeros(c * p)
        G = C.Params.over(grads, dims)
        opt = Adam(c * p, args.lr)
        state = params.nbytes + grads.nbytes + opt.m.nbytes + opt.v.nbytes
    elif stage == 1:
        grads = np.zeros(c * p)
        G = C.Params.over(grads, dims)
        gshard = np.zeros(c)
        opt = Adam(c, args.lr)
        state = params.nbytes + grads.nbytes + gshard.nbytes + opt.m.nbytes + opt.v.nbytes
    else:
        largest = max(P.offsets[i + 1] - P.offsets[i] for i in range(len(P.W)))
        scratch = np.zeros(largest)
        G = aliased_grads(dims, scratch)
        gshard = np.zeros(c)
        opt = Adam(c, args.lr)
        state = params.nbytes + scratch.nbytes + gshard.nbytes + opt.m.nbytes + opt.v.nbytes

        def send_layer(i):                      # back-prop hook: layer i's gradient is done
            lo, hi = P.offsets[i], P.offsets[i + 1]
            # rank r receives the part of [lo, hi) inside its shard [r*c, (r+1)*c)
            counts = [max(0, min(hi, (r + 1) * c) - max(lo, r * c)) for r in range(p)]
            at = max(lo, rank * c) - rank * c
            with clock("comm"):
                comm.Reduce_scatter(scratch[:hi - lo], gshard[at:at + counts[rank]],
                                    counts, op=mod.SUM)

    times = []
    for batch in steps:
        comm.Barrier()                           # each step timed on its own
        clock.total.clear()
        t0 = mod.Wtime()
        shard = np.array_split(batch, p)[rank]
        out, cache = C.mlp_forward(P, X[shard])
        _, d = C.softmax_xent(out, y[shard])
        C.mlp_backward(P, G, cache, d, on_layer=send_layer if stage == 2 else None)
        if stage == 0:
            with clock("comm"):
                comm.Allreduce(mod.IN_PLACE, grads, op=mod.SUM)
            opt.step(params, grads / len(batch))
        else:
            if stage == 1:
                with clock("comm"):
                    comm.Reduce_scatter_block(grads, gshard, op=mod.SUM)
            opt.step(params[mine], gshard / len(batch))
            with clock("comm"):
                comm.Allgather(params[mine].copy(), params)
        times.append({"step": mod.Wtime() - t0, **clock.total})
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"params": params[:n].copy(), "state_bytes": state, "peak": peak,
            "times": times}


def main(argv=None) -> int:
    """Train plain, ZeRO-1 and ZeRO-2; check against one process; report; exit status."""
    def add(ap):
        ap.add_argument("--width", type=int, default=None, help="hidden width")
        ap.add_argument("--layers", type=int, default=3, help="hidden layers (default 3)")
        ap.add_argument("--steps", type=int, default=None, help="Adam steps per variant")
        ap.add_argument("--lr", type=float, default=1e-3)

    args = C.parse_args(__doc__.splitlines()[0], add, argv)
    args.width = args.width or (64 if args.small else 1024)
    args.steps = args.steps or (3 if args.small else 6)
    mod, comm = C.world()
    rank, p = comm.rank, comm.size
    data = C.load_data(args.seed, comm=comm)
    wire = C.WireCounter(comm)
    dims = [64] + [args.width] * args.layers + [10]
    flat0 = C.init_mlp(dims, args.seed)
    comm.Bcast(flat0, root=0)
    steps = C.full_batches(len(data[1]), args.batch_size, args.seed, args.steps)
    n = flat0.size
    c = -(-n // p)                       # each rank's shard; vectors are padded to c·p
    if rank == 0:
        print(f"MLP {'-'.join(map(str, dims))}: N = {n} params, Adam, {p} ranks, batch "
              f"{args.batch_size}, {args.steps} steps (first untimed)", flush=True)
    ref = reference(args, dims, flat0, data, steps)
    P0 = C.Params.over(flat0, dims)
    largest = max(P0.offsets[i + 1] - P0.offsets[i] for i in range(len(P0.W)))
    formula = {0: 8 * n + 8 * n + 16 * n,
               1: 8 * n + 8 * n + 24 * n / p,          # + the shard's reduced gradient
               2: 8 * n + 8 * largest + 24 * n / p}
    ok = True
    rows = []
    for stage in (0, 1, 2):
        wire.take()
        res = train(stage, args, dims, flat0, data, steps, comm, mod)
        sent, _ = wire.take()
        good, gap = C.close(res["params"], ref)
        every = comm.gather((good, gap, res["state_bytes"], res["peak"], res["times"],
                             sent), root=0)
        if rank == 0:
            name = "plain DP" if stage == 0 else f"ZeRO-{stage}"
            ok &= C.check(rank, all(e[0] for e in every),
                          f"{name}: weights after {args.steps} Adam steps equal the "
                          f"single-process run's on every rank (max rel. diff "
                          f"{max(e[1] for e in every):.2g})")
            med = C.step_medians([e[4] for e in every])
            rows.append((name, max(e[2] for e in every), formula[stage],
                         max(e[3] for e in every), med["step"], med["comm"],
                         np.mean([e[5] for e in every]) / args.steps))
    if rank == 0:
        print(f"{'scheme':<9} {'state/rank':>11} {'formula':>10} {'peak alloc':>11} "
              f"{'step ms':>8} {'comm ms':>8} {'share':>6} {'sent/rank/step':>15} "
              f"{'formula':>11}")
        bytes_ok = True
        for stage, (name, state, form, peak, step_s, comm_s, sent) in enumerate(rows):
            # plain: the chosen all-reduce's bytes; ZeRO: (p-1)/p·N reduce-scatter and as
            # much all-gather, 2(p-1)/p·N in all (the paper's "same as data parallel").
            # Every buffer but ZeRO-2's per-layer gradients is padded to c·p elements.
            padded = 8 * c * p
            alg = comm.chosen_algorithm("allreduce", padded)
            want = {0: C.allreduce_bytes(alg, padded, p),
                    1: (C.half_ring_bytes(comm, "reduce_scatter_block", padded)
                        + C.half_ring_bytes(comm, "allgather", padded)),
                    2: (p - 1) / p * 8 * n + C.half_ring_bytes(comm, "allgather", padded)
                    }[stage]
            print(f"{name:<9} {C.mib(state):>11} {C.mib(form):>10} {C.mib(peak):>11} "
                  f"{step_s * 1e3:8.1f} {comm_s * 1e3:8.1f} {comm_s / step_s:6.1%} "
                  f"{C.mib(sent):>15} {C.mib(want):>11}")
            bytes_ok &= bool(np.isclose(sent, want))
        print("(state formula, float64: plain 32N; ZeRO-1 16N + 24N/p; ZeRO-2 8N + 8·largest "
              "layer + 24N/p. Peak alloc: tracemalloc during training, the largest over "
              "ranks. Step and comm ms: medians over the steps after the first. Bytes "
              "formula: the chosen all-reduce's (2(p-1)/p·N, or log2(p)·N for recursive "
              "doubling); ZeRO: (p-1)/p·N reduce-scatter + as much "
              "all-gather)", flush=True)
        ok &= C.check(rank, bytes_ok, "bytes sent per rank per step equal the formulas")
        ok &= C.check(rank, rows[2][1] < rows[1][1] < rows[0][1],
                      "state per rank shrinks: plain > ZeRO-1 > ZeRO-2 "
                      f"({' > '.join(C.mib(r[1]) for r in rows)})")
    return C.finish(comm, ok)


if __name__ == "__main__":
    sys.exit(main())
