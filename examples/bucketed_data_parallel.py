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

import _training as C

import numpy as np  # noqa: E402  (after _training pins the BLAS threads)


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
    # the buckets' Iallreduce sends messages whatever a blocking call of that size would do
    return sum(C.allreduce_bytes(comm.chosen_algorithm("allreduce", b,
                                                       blocking=mode == "blocking"),
                                 b, comm.size)
               for b in sizes)


class Replica:
    """One variant's training state on this rank: weights, gradient, momentum, buckets."""

    def __init__(self, mode: str, args, dims, flat0: np.ndarray, comm, mod):
        self.mode, self.args, self.comm, self.mod = mode, args, comm, mod
        self.params = flat0.copy()
        self.grads = np.zeros_like(self.params)
        self.velocity = np.zeros_like(self.params)
        self.P = C.Params.over(self.params, dims)
        self.G = C.Params.over(self.grads, dims)
        self.buckets = make_buckets(self.P, int(args.bucket_mib * 2**20))
        self.starts = {first: b for b, (first, _) in enumerate(self.buckets)}
        self.reqs: list = []
        self.times: list[tuple[float, float, float]] = []   # (step, compute, exposed comm)

    def _post(self, first: int) -> None:
        """Back-prop hook: when layer ``first`` opens a bucket, the bucket is complete."""
        b = self.starts.get(first)
        if b is not None:
            sl = self.P.span(*self.buckets[b])
            self.reqs.append(self.comm.Iallreduce(self.mod.IN_PLACE, self.grads[sl],
                                                  op=self.mod.SUM))

    def step(self, X: np.ndarray, y: np.ndarray, batch: np.ndarray) -> None:
        """One SGD-momentum step on this rank's shard of ``batch``; records its times."""
        comm, mod = self.comm, self.mod
        shard = np.array_split(batch, comm.size)[comm.rank]
        t0 = mod.Wtime()
        out, cache = C.mlp_forward(self.P, X[shard])
        _, dlogits = C.softmax_xent(out, y[shard])
        C.mlp_backward(self.P, self.G, cache, dlogits,
                       on_layer=self._post if self.mode == "overlap" else None)
        t1 = mod.Wtime()
        if self.mode == "blocking":
            comm.Allreduce(mod.IN_PLACE, self.grads, op=mod.SUM)
        elif self.mode == "buckets":
            for first, _ in self.buckets:
                self._post(first)
        mod.Request.Waitall(self.reqs)
        self.reqs.clear()
        t2 = mod.Wtime()
        self.grads /= len(batch)
        self.velocity *= self.args.momentum
        self.velocity -= self.args.lr * self.grads
        self.params += self.velocity
        t3 = mod.Wtime()
        self.times.append((t3 - t0, (t1 - t0) + (t3 - t2), t2 - t1))


MODES = ("blocking", "buckets", "overlap")


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
    args.steps = args.steps or (4 if args.small else 10)
    args.hidden = args.hidden or (128 if args.small else 1024)
    args.bucket_mib = args.bucket_mib or (0.1 if args.small else 8.0)
    mod, comm = C.world()
    rank, size = comm.rank, comm.size
    data = C.load_data(args.seed, comm=comm)
    wire = C.WireCounter(comm)
    dims = [64] + [args.hidden] * args.layers + [10]
    flat0 = C.init_mlp(dims, args.seed)
    comm.Bcast(flat0, root=0)          # rank 0's weights are the job's weights
    steps = C.full_batches(len(data[1]), args.batch_size, args.seed, args.steps)
    n = flat0.size
    replicas = [Replica(mode, args, dims, flat0, comm, mod) for mode in MODES]
    if rank == 0:
        print(f"MLP {'-'.join(map(str, dims))}: {n} params ({C.mib(8 * n)} of float64 "
              f"gradient), {size} ranks, global batch {args.batch_size}, {args.steps} steps "
              f"per variant, {len(replicas[0].buckets)} buckets of <= {args.bucket_mib} MiB "
              f"(+ the layer that crosses it); whole-gradient all-reduce: "
              f"{comm.chosen_algorithm('allreduce', 8 * n)}", flush=True)

    t0 = C.time.perf_counter()
    ref, losses = C.sgd_reference(dims, flat0, data[0], data[1], steps, args.lr,
                                  args.momentum)
    ref_step = (C.time.perf_counter() - t0) / len(steps)
    # The variants take turns, one step each, so that the load of a shared machine falls
    # on all three alike; a barrier before each turn keeps one variant's stragglers out of
    # the next one's time. Bytes are counted per variant.
    sent = dict.fromkeys(MODES, 0)
    for batch in steps:
        for rep in replicas:
            comm.Barrier()
            wire.take()
            rep.step(data[0], data[1], batch)
            sent[rep.mode] += wire.take()[0]
    ok = True
    rows = []
    for rep in replicas:
        good, gap = C.close(rep.params, ref)
        every = comm.gather((good, gap, rep.times, sent[rep.mode]), root=0)
        if rank != 0:
            continue
        ok &= C.check(rank, all(e[0] for e in every),
                      f"{rep.mode}: weights after {args.steps} steps equal the single-process "
                      f"run's on every rank (max rel. diff {max(e[1] for e in every):.2g}, "
                      f"rtol 1e-9)")
        # per step: the slowest rank's time; then the median over the steps after the
        # first (a warm-up that starts pycomm's progress thread)
        t = np.array([e[2] for e in every])[:, 1:, :]          # rank, step, what
        step_ms = np.median(t[:, :, 0].max(axis=0)) * 1e3
        comp, exposed = (np.median(t[:, :, i].mean(axis=0)) * 1e3 for i in (1, 2))
        rows.append((rep.mode, step_ms, comp, exposed,
                     np.mean([e[3] for e in every]) / args.steps,
                     expected_bytes(comm, rep.mode, rep.buckets, dims, n)))
    if rank == 0:
        print(f"single process, whole batches: {ref_step * 1e3:.1f} ms/step (loss "
              f"{losses[0]:.1f} -> {losses[-1]:.1f} summed over the batch)")
        print(f"{'variant':<9} {'step ms':>8} {'compute':>8} {'exposed comm':>13} "
              f"{'share':>6} {'bytes sent/rank/step':>21} {'formula':>11}")
        for mode, step_ms, comp, comm_ms, per_step, formula in rows:
            print(f"{mode:<9} {step_ms:8.1f} {comp:8.1f} {comm_ms:13.1f} "
                  f"{comm_ms / (comp + comm_ms):6.1%} {C.mib(per_step):>21} "
                  f"{C.mib(formula):>11}")
        print("(medians over the steps after the first: step ms, the slowest rank's; compute "
              "and exposed comm, the mean over ranks; share = exposed / (compute + exposed); "
              "formula: 2(p-1)/p*N per all-reduce, log2(p)*N where recursive doubling is "
              "chosen)", flush=True)
        ok &= C.check(rank, losses[-1] < losses[0],
                      f"training lowers the loss ({losses[0]:.1f} -> {losses[-1]:.1f})")
        ok &= C.check(rank, all(np.isclose(r[4], r[5]) for r in rows),
                      "bytes sent per rank equal the chosen algorithms' formula")
    return C.finish(comm, ok)


if __name__ == "__main__":
    sys.exit(main())
