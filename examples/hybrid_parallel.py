"""Hybrid parallel: data parallel x tensor parallel on a grid of ranks, built with ``Split``.

The layout large-model training uses (Megatron-LM, Shoeybi et al. 2019,
arXiv:1909.08053, section 5.2; Narayanan et al. 2021, "Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM", SC21): the p = dp x tp ranks form a
grid; rank r sits at row ``r // tp`` (its data-parallel replica) and column ``r % tp``
(its tensor-parallel shard)::

              tp index 0   tp index 1
    replica 0   rank 0       rank 1      <- one tensor-parallel group (a row)
    replica 1   rank 2       rank 3
                  ^ one data-parallel group (a column)

``COMM_WORLD.Split(color=row)`` gives each row its tensor-parallel communicator and
``Split(color=column)`` each column its data-parallel one. Within a row the ranks run the
Megatron MLP blocks of ``tensor_parallel.py`` (column- then row-parallel, one all-reduce
per block forward and backward, over the row's communicator) on the row's share of each
batch; across rows, each rank all-reduces its gradients (its shard of the split weights and
the replicated ones) with the other replicas of its column, as plain data parallel does
(PyTorch DDP: Li et al. 2020, arXiv:2006.15704). Communication stays within a row for
activations and within a column for gradients.

It checks that, after ``--steps`` SGD steps, the weights joined from each row's shards
equal (rtol 1e-9) those of the unsplit model trained in one process on whole batches, on
every rank, and that the test-set logits do too; it prints the step time, the share of
tensor- and data-parallel communication and the bytes sent against the formulas.

Run::

    python launch.py -n 4 examples/hybrid_parallel.py [--tp 2] [--width 256]
"""

from __future__ import annotations

import sys

import _training as C
import tensor_parallel as T

import numpy as np  # noqa: E402  (after _training pins the BLAS threads)


def main(argv=None) -> int:
    """Train on the dp x tp grid, check against one process, report; exit status."""
    def add(ap):
        ap.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks per row")
        ap.add_argument("--width", type=int, default=None, help="d (the MLP's inner is 4d)")
        ap.add_argument("--blocks", type=int, default=2, help="Megatron MLP blocks")
        ap.add_argument("--steps", type=int, default=None, help="SGD steps")
        ap.add_argument("--lr", type=float, default=0.05)
        ap.add_argument("--momentum", type=float, default=0.9)

    args = C.parse_args(__doc__.splitlines()[0], add, argv)
    args.width = args.width or (32 if args.small else 256)
    args.steps = args.steps or (4 if args.small else 10)
    mod, comm = C.world()
    rank, size = comm.rank, comm.size
    if size % args.tp:
        raise SystemExit(f"{size} ranks do not make a grid of rows of --tp {args.tp}")
    tp_size, dp_size = args.tp, size // args.tp
    row, col = rank // tp_size, rank % tp_size
    if (args.batch_size // dp_size) % tp_size or args.batch_size % dp_size:
        raise SystemExit(f"--batch-size {args.batch_size} must split into {dp_size} equal "
                         f"replica shards, each dividing by {tp_size}")
    tp = comm.Split(color=row, key=col)       # my row: the tensor-parallel group
    dp = comm.Split(color=col, key=row)       # my column: the data-parallel group
    placed = comm.allreduce(int(tp.rank == col and dp.rank == row), op=mod.MIN)
    args.dp, args.world = dp, comm
    data = C.load_data(args.seed, comm=comm)
    wire = C.WireCounter(comm)
    full0 = T.full_init(args.width, args.blocks, args.seed)
    mine0 = T.shard(full0, args.blocks, col, tp_size)
    n_mine = sum(v.size for v in mine0.values())
    B, d = args.batch_size, args.width
    if rank == 0:
        print(f"grid {dp_size} (data parallel) x {tp_size} (tensor parallel) of {size} "
              f"ranks; model 64-{d}-[{args.blocks} x ({d}-{4 * d}-{d})]-10, "
              f"{sum(v.size for v in full0.values())} params, {n_mine} per rank; batch {B} "
              f"({B // dp_size} rows per replica), {args.steps} steps (first untimed)",
              flush=True)
    ref, ref_times = T.train(args_ref(args), data, full0)
    ref_step = C.step_medians([ref_times])["step"]
    ref_logits, _ = T.forward(ref, data[2], args.blocks)

    ok = C.check(rank, bool(placed), f"Split put every rank r at row r // {tp_size}, column "
                 f"r % {tp_size} (its rank in each group is its key)")
    rows_out = []
    for variant in ("megatron", "sequence"):
        wire.take()
        w, times = T.train(args, data, mine0, variant, tp, mod, mod.Wtime,
                                   rows=lambda batch: np.array_split(batch, dp_size)[row])
        sent, _ = wire.take()
        whole = T.unshard(w, args.blocks, tp)
        worst = max(C.close(whole[key], ref[key])[1] for key in ref)
        logits, _ = T.forward(w, data[2], args.blocks, tp, mod)
        lgap = C.close(logits, ref_logits)[1]
        every = comm.gather((worst, lgap, times, sent), root=0)
        if rank != 0:
            continue
        worst, lworst = max(e[0] for e in every), max(e[1] for e in every)
        ok &= C.check(rank, worst <= 1e-9 and lworst <= 1e-9,
                      f"{variant}: on every rank the row's joined weights and the test-set "
                      f"logits after {args.steps} steps equal the unsplit single-process "
                      f"model's (max rel. diff {max(worst, lworst):.2g}; test accuracy "
                      f"{C.accuracy(logits, data[3]):.3f})")
        med = C.step_medians([e[2] for e in every])
        act = (B // dp_size) * d * 8
        if variant == "megatron":
            tp_form = 2 * args.blocks * C.allreduce_bytes(
                tp.chosen_algorithm("allreduce", act), act, tp_size)
        else:
            rep = 8 * sum(v.size for key, v in full0.items()
                          if key not in T.sharded_keys(args.blocks))
            tp_form = (2 * args.blocks * (C.half_ring_bytes(tp, "allgather", act) +
                                          C.half_ring_bytes(tp, "reduce_scatter_block", act))
                       + C.allreduce_bytes(tp.chosen_algorithm("allreduce", rep + 8),
                                           rep + 8, tp_size))
        dp_form = C.allreduce_bytes(dp.chosen_algorithm("allreduce", 8 * n_mine),
                                    8 * n_mine, dp_size)
        rows_out.append((variant, med["step"] * 1e3, med["comm"] * 1e3, med["dp comm"] * 1e3,
                         np.mean([e[3] for e in every]) / args.steps, tp_form, dp_form))
    if rank == 0:
        print(f"single process, unsplit: {ref_step * 1e3:.1f} ms/step")
        print(f"{'variant':<9} {'step ms':>8} {'tp comm':>8} {'dp comm':>8} {'share':>6} "
              f"{'sent/rank/step':>15} {'formula (tp + dp)':>24}")
        for variant, step_ms, tpc, dpc, sent, tp_form, dp_form in rows_out:
            print(f"{variant:<9} {step_ms:8.2f} {tpc:8.2f} {dpc:8.2f} "
                  f"{(tpc + dpc) / step_ms:6.1%} {C.mib(sent):>15} "
                  f"{C.mib(tp_form + dp_form):>10} ({C.mib(tp_form)} + {C.mib(dp_form)})")
        print("(tp: 2 x blocks all-reduces of (B/dp)·d in the row, or the sequence-parallel "
              "all-gathers and reduce-scatters; dp: one all-reduce of the rank's gradient "
              "in the column; medians over the steps after the first: step ms the slowest rank's, "
              "comm ms the mean over ranks)",
              flush=True)
        ok &= C.check(rank, all(np.isclose(r[4], r[5] + r[6]) for r in rows_out),
                      "bytes sent per rank per step equal the formulas (tp + dp)")
    tp.Free()
    dp.Free()
    return C.finish(comm, ok)


def args_ref(args):
    """The options of the single-process reference: the same, with no communicators."""
    import copy

    ref = copy.copy(args)
    ref.dp = ref.world = None
    return ref


if __name__ == "__main__":
    sys.exit(main())
