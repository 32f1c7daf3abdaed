"""Bucketed, overlapped data parallel: all-reduce gradient buckets while back-prop goes on.

The scheme of PyTorch DDP (Li et al. 2020, "PyTorch Distributed: Experiences on
Accelerating Data Parallel Training", VLDB, arXiv:2006.15704): every rank holds the whole
model and a shard of each global batch; gradients are laid out in *buckets* of a few MiB
in reverse layer order, and each bucket is all-reduced with a nonblocking ``Iallreduce``
the moment back-propagation has written its last gradient, while back-propagation of the
earlier layers continues. Only what is still in flight when back-prop ends is exposed.

The model is a numpy MLP 64 -> 1024 x4 -> 10 (3.2 M float64 parameters, 25 MiB of
gradient per step) on scikit-learn's digits. Three variants train from the same weights on
the same batches, and each one's weights must equal (rtol 1e-9) those of the same steps
run in one process on whole batches:

* ``blocking``: back-prop, then one ``Allreduce`` of the whole gradient;
* ``buckets``: back-prop, then an ``Iallreduce`` per bucket and ``Waitall`` (same
  messages as the overlapped run, no overlap);
* ``overlap``: an ``Iallreduce`` per bucket posted from the back-prop hook, ``Waitall``
  just before the optimizer step.

It prints, per variant, the step time, the exposed communication (time between the end of
back-prop and the end of the all-reduces) and its share of a step, and the bytes each rank
sent against the bandwidth-optimal all-reduce's 2(p-1)/p·N. pycomm runs nonblocking
collectives on a progress thread; overlap is real only where the ranks have cores to
spare (with 4 ranks on 2 cores, back-prop and the progress thread share them).

Run::

    python launch.py -n 4 examples/bucketed_data_parallel.py [--bucket-mib 8] [--steps 8]
"""

from __future__ import annotations

import sys

import _common as C

import numpy as np  # noqa: E402  (after _common pins the BLAS threads)


def make_buckets(p: C.Params, cap_bytes: int) -> list[tuple[int, int]]:
    """Group layers, last first, into buckets of at least ``cap_bytes`` (the last smaller).

    Returns ``(first, last)`` layer ranges in the order back-prop completes them; each is
    one contiguous slice of the flat gradient (:meth:`Params.span`). Layers stay whole, as
    DDP keeps each parameter tensor in one bucket.
    """
    out, last = [], len(p.W) - 1
    for i in range(len(p.W) - 1, -1, -1):
        size = (p.offsets[last + 1] - p.offsets[i]) * 8
        if size >= cap_bytes or i == 0:
            out.append((i, last))
            last = i - 1
    return out


def expected_bytes(comm, mode, buckets, dims, n) -> float:
    """Bytes per rank per step the chosen all-reduce algorithms should send."""
    if mode == "blocking":
        sizes = [8 * n]
    else:
        p = C.Params.over(np.empty(n), dims)
        sizes = [8 * (p.offsets[last + 1] - p.offsets[first]) for first, last in buckets]
    return sum(C.allreduce_bytes(comm.chosen_algorithm("allreduce", b), b, comm.size)
               for b in sizes)


def train(mode, args, data, dims, flat0, steps_batches, comm=None, mod=None, timer=None):
    """Train ``len(steps_batches)`` SGD-momentum steps; return (params, Clock, step_seconds).

    ``comm`` None: the single-process reference on whole batches. The first step is a
    warm-up (it starts the progress thread); ``step_seconds`` times the others.
    """
    X, y = data[0], data[1]
    rank, size = (0, 1) if comm is None else (comm.rank, comm.size)
    params = flat0.copy()
    grads = np.zeros_like(params)
    velocity = np.zeros_like(params)
    p, g = C.Params.over(params, dims), C.Params.over(grads, dims)
    buckets = make_buckets(p, int(args.bucket_mib * 2**20))
    starts = {first: b for b, (first, _) in enumerate(buckets)}
    clock = C.Clock(timer or C.time.perf_counter)
    reqs = []
    losses = []

    def post(first):                            # back-prop hook: bucket complete?
        b = starts.get(first)
        if b is not None:
            sl = p.span(*buckets[b])
            reqs.append(comm.Iallreduce(mod.IN_PLACE, grads[sl], op=mod.SUM))

    t_start = None
    for step, batch in enumerate(steps_batches):
        if step == 1:
            if comm is not None:
                comm.Barrier()
            t_start = clock.timer()
        shard = batch if comm is None else np.array_split(batch, size)[rank]
        t0 = clock.timer()
        out, cache = C.mlp_forward(p, X[shard])
        loss, dlogits = C.softmax_xent(out, y[shard])
        hook = post if (comm is not None and mode == "overlap") else None
        C.mlp_backward(p, g, cache, dlogits, on_layer=hook)
        t1 = clock.timer()
        if comm is not None:
            if mode == "blocking":
                comm.Allreduce(mod.IN_PLACE, grads, op=mod.SUM)
            elif mode == "buckets":
                for first, _ in buckets:
                    post(first)
            mod.Request.Waitall(reqs)
            reqs.clear()
        t2 = clock.timer()
        grads /= len(batch)
        velocity *= args.momentum
        velocity -= args.lr * grads
        params += velocity
        t3 = clock.timer()
        if step >= 1:
            clock.add("compute", (t1 - t0) + (t3 - t2))
            clock.add("exposed comm", t2 - t1)
        losses.append(loss)
    if comm is not None:
        comm.Barrier()
    n_timed = max(len(steps_batches) - 1, 1)
    step_s = (clock.timer() - t_start) / n_timed if t_start is not None else 0.0
    return params, clock, step_s, losses


def main(argv=None) -> int:
    """Run the three variants, check each against the reference, report; exit status."""
    def add(ap):
        ap.add_argument("--steps", type=int, default=None, help="SGD steps per variant")
        ap.add_argument("--hidden", type=int, default=None, help="hidden width")
        ap.add_argument("--layers", type=int, default=4, help="hidden layers (default 4)")
        ap.add_argument("--bucket-mib", type=float, default=None,
                        help="bucket size cap in MiB (default 8; DDP's is 25)")
        ap.add_argument("--lr", type=float, default=0.02)
        ap.add_argument("--momentum", type=float, default=0.9)

    args = C.parse_args(__doc__.splitlines()[0], add, argv)
    args.steps = args.steps or (4 if args.small else 8)
    args.hidden = args.hidden or (128 if args.small else 1024)
    args.bucket_mib = args.bucket_mib or (0.1 if args.small else 8.0)
    mod, comm = C.world()
    rank, size = comm.rank, comm.size
    wire = C.WireCounter(comm)
    data = C.load_data(args.seed)
    dims = [64] + [args.hidden] * args.layers + [10]
    flat0 = C.init_mlp(dims, args.seed)
    comm.Bcast(flat0, root=0)          # rank 0's weights are the job's weights
    steps = C.full_batches(len(data[1]), args.batch_size, args.seed, args.steps)
    n = flat0.size
    buckets = make_buckets(C.Params.over(flat0, dims), int(args.bucket_mib * 2**20))
    if rank == 0:
        print(f"MLP {'-'.join(map(str, dims))}: {n} params ({C.mib(8 * n)} of float64 "
              f"gradient), {size} ranks, global batch {args.batch_size}, {args.steps} steps "
              f"per variant (first one untimed), {len(buckets)} buckets of <= "
              f"{args.bucket_mib} MiB (+ the layer that crosses it); whole-gradient "
              f"all-reduce: {comm.chosen_algorithm('allreduce', 8 * n)}", flush=True)

    ref, _, ref_step, ref_losses = train("ref", args, data, dims, flat0, steps)
    ok = True
    rows = []
    for mode in ("blocking", "buckets", "overlap"):
        wire.take()
        params, clock, step_s, _ = train(mode, args, data, dims, flat0, steps, comm, mod,
                                         mod.Wtime)
        sent, msgs = wire.take()
        good, gap = C.close(params, ref)
        every = comm.gather((good, gap, step_s, clock.get("compute"),
                             clock.get("exposed comm"), sent, msgs), root=0)
        if rank == 0:
            n_timed = args.steps - 1
            step_ms = max(e[2] for e in every) * 1e3
            comp = np.mean([e[3] for e in every]) / n_timed * 1e3
            comm_ms = np.mean([e[4] for e in every]) / n_timed * 1e3
            per_step = np.mean([e[5] for e in every]) / args.steps
            formula = expected_bytes(comm, mode, buckets, dims, n)
            rows.append((mode, step_ms, comp, comm_ms, per_step, formula))
            ok &= C.check(rank, all(e[0] for e in every),
                          f"{mode}: weights after {args.steps} steps equal the single-process "
                          f"run's on every rank (max rel. diff {max(e[1] for e in every):.2g}"
                          f", rtol 1e-9)")
    if rank == 0:
        print(f"single process, whole batches: {ref_step * 1e3:.1f} ms/step "
              f"(loss {ref_losses[0]:.1f} -> {ref_losses[-1]:.1f} summed over the batch)")
        print(f"{'variant':<9} {'step ms':>8} {'compute':>8} {'exposed comm':>13} "
              f"{'share':>6} {'bytes sent/rank/step':>21} {'formula':>11}")
        for mode, step_ms, comp, comm_ms, per_step, formula in rows:
            print(f"{mode:<9} {step_ms:8.1f} {comp:8.1f} {comm_ms:13.1f} "
                  f"{comm_ms / (comp + comm_ms):6.1%} {C.mib(per_step):>21} "
                  f"{C.mib(formula):>11}")
        print("(step ms: wall time per step, slowest rank; compute and exposed comm: "
              "mean over ranks; share = exposed / (compute + exposed); formula: "
              "2(p-1)/p*N per all-reduce, log2(p)*N where recursive doubling is chosen)",
              flush=True)
        ok &= C.check(rank, ref_losses[-1] < ref_losses[0],
                      f"training lowers the loss ({ref_losses[0]:.1f} -> "
                      f"{ref_losses[-1]:.1f})")
    return C.finish(comm, ok)


if __name__ == "__main__":
    sys.exit(main())
