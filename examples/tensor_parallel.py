"""Tensor parallel, Megatron-LM's 1-D scheme: column- then row-parallel linear layers.

Megatron-LM (Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter
Language Models Using Model Parallelism", arXiv:1909.08053, section 3) splits each MLP
block ``relu(h A + a) B`` over the p ranks: A by columns (column-parallel, no
communication: the relu is applied to each rank's own columns) and B by rows
(row-parallel: each rank's product is a partial sum of the output). One all-reduce per
block joins the partial outputs in the forward pass (operator g) and one joins the
partial input gradients in the backward pass (operator f). Every rank sees the whole
batch; the parameters are what is split.

The all-gather variant is Megatron's sequence parallelism (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198): the
activations between blocks are split by rows of the batch, so g becomes a
reduce-scatter (``Reduce_scatter_block``) and f an ``Allgather`` in the forward pass, and
the other way round in the backward pass; the replicated parameters' gradients, computed
on a row shard each, are then all-reduced once per step. Same bytes as the all-reduce
(an all-reduce *is* a reduce-scatter followed by an all-gather), a 1/p share of the
activations per rank.

The model: digits (64 pixels) -> relu(embedding, d) -> ``--blocks`` residual Megatron
MLP blocks (d -> 4d -> d) -> 10 logits; the embedding, head and block output biases are
replicated. Both variants train ``--steps`` SGD steps from the same weights; the example
then checks, against the unsplit model run in one process (rtol 1e-9): the test-set logits
before training, every weight after training (shards gathered and joined) and the
test-set logits after training. It prints step time, communication share and the bytes
each rank sent per step against the formula.

Run::

    python launch.py -n 4 examples/tensor_parallel.py [--width 256] [--blocks 2]
"""

from __future__ import annotations

import sys

import _training as C

import numpy as np  # noqa: E402  (after _training pins the BLAS threads)


def full_init(d: int, blocks: int, seed: int, d_in: int = 64, k: int = 10) -> dict:
    """The unsplit model's weights (float64): embedding, blocks (A, a, B, bB), head."""
    rng = np.random.default_rng(seed)
    f = 4 * d
    w = {"We": rng.normal(0, np.sqrt(2 / d_in), (d_in, d)), "be": np.zeros(d)}
    for b in range(blocks):
        w[f"A{b}"] = rng.normal(0, np.sqrt(2 / d), (d, f))
        w[f"a{b}"] = np.zeros(f)
        # scaled down so that the residual stream does not grow with depth (GPT-2's rule)
        w[f"B{b}"] = rng.normal(0, np.sqrt(1 / f / (2 * blocks)), (f, d))
        w[f"bB{b}"] = np.zeros(d)
    w["Wh"] = rng.normal(0, np.sqrt(1 / d), (d, k))
    w["bh"] = np.zeros(k)
    return w


def sharded_keys(blocks: int) -> set:
    """Names of the split weights: A (by columns), a (with A's columns), B (by rows)."""
    return {f"{n}{b}" for b in range(blocks) for n in ("A", "a", "B")}


def shard(w: dict, blocks: int, rank: int, size: int) -> dict:
    """This rank's weights: its columns of each A and a, its rows of each B; the rest whole."""
    f = w["A0"].shape[1]
    cols = np.array_split(np.arange(f), size)[rank]
    s = slice(int(cols[0]), int(cols[-1]) + 1) if len(cols) else slice(0, 0)
    out = {}
    for key, v in w.items():
        if key in sharded_keys(blocks):
            v = v[s, :] if key.startswith("B") else (v[:, s] if v.ndim == 2 else v[s])
        out[key] = np.ascontiguousarray(v)
    return out


def unshard(w: dict, blocks: int, tp) -> dict:
    """Join every rank's shards of ``tp`` back into the full weights (object allgather)."""
    if tp is None or tp.size == 1:
        return {key: v.copy() for key, v in w.items()}
    parts = tp.allgather({key: w[key] for key in sharded_keys(blocks)})
    out = {key: v.copy() for key, v in w.items()}
    for key in sharded_keys(blocks):
        axis = 0 if key.startswith("B") or key.startswith("a") else 1
        out[key] = np.concatenate([p[key] for p in parts], axis=axis)
    return out


def _reduce(tp, mod, buf, clock):
    """Megatron's g (forward) / f (backward): sum ``buf`` over the tensor-parallel ranks."""
    if tp is not None and tp.size > 1:
        with clock("comm"):
            tp.Allreduce(mod.IN_PLACE, buf, op=mod.SUM)


def forward(w, X, blocks, tp=None, mod=None, clock=None):
    """Megatron forward of the rows ``X``; returns (logits, cache). One all-reduce a block."""
    clock = clock or C.Clock()
    z0 = C.linear_forward(X, w["We"], w["be"])
    h = np.maximum(z0, 0.0)
    caches = []
    for b in range(blocks):
        part, cache = C.tp_block_forward(h, w[f"A{b}"], w[f"a{b}"], w[f"B{b}"])
        _reduce(tp, mod, part, clock)
        h = h + part + w[f"bB{b}"]
        caches.append(cache)
    return C.linear_forward(h, w["Wh"], w["bh"]), (X, z0, caches, h)


def backward(w, g, cache, dlogits, blocks, tp=None, mod=None, clock=None):
    """Megatron backward; writes every gradient of ``g``. One all-reduce a block."""
    clock = clock or C.Clock()
    X, z0, caches, h = cache
    dh = C.linear_backward(h, w["Wh"], dlogits, g["Wh"], g["bh"])
    for b in range(blocks - 1, -1, -1):
        dh.sum(axis=0, out=g[f"bB{b}"])
        dpart = C.tp_block_backward(caches[b], w[f"A{b}"], w[f"B{b}"], dh,
                                    g[f"A{b}"], g[f"a{b}"], g[f"B{b}"])
        _reduce(tp, mod, dpart, clock)
        dh = dh + dpart                       # the residual path adds the block's input grad
    C.relu_backward(dh, z0)
    C.linear_backward(X, w["We"], dh, g["We"], g["be"], need_dx=False)


def step_sequence_parallel(w, g, X, y, blocks, tp, mod, clock) -> float:
    """One forward + backward with row-sharded activations (reduce-scatter / all-gather).

    ``X``, ``y``: the whole batch (its rows must divide by the ranks). Writes ``g``
    complete on every rank; returns the batch's summed loss.
    """
    p, r = tp.size, tp.rank
    rows = len(y) // p
    Xs, ys = X[r * rows:(r + 1) * rows], y[r * rows:(r + 1) * rows]
    z0 = C.linear_forward(Xs, w["We"], w["be"])
    hs = np.maximum(z0, 0.0)
    d = hs.shape[1]
    caches = []
    for b in range(blocks):
        full = np.empty((rows * p, d))                # kept by the cache: one per block
        with clock("comm"):
            tp.Allgather(hs, full)                    # f: the whole batch's rows
        part, cache = C.tp_block_forward(full, w[f"A{b}"], w[f"a{b}"], w[f"B{b}"])
        mine = np.empty((rows, d))
        with clock("comm"):
            tp.Reduce_scatter_block(part, mine, op=mod.SUM)   # g: my rows, summed
        hs = hs + mine + w[f"bB{b}"]
        caches.append(cache)
    logits = C.linear_forward(hs, w["Wh"], w["bh"])
    loss, dlogits = C.softmax_xent(logits, ys)
    dhs = C.linear_backward(hs, w["Wh"], dlogits, g["Wh"], g["bh"])
    for b in range(blocks - 1, -1, -1):
        dhs.sum(axis=0, out=g[f"bB{b}"])
        dfull = np.empty((rows * p, d))
        with clock("comm"):
            tp.Allgather(dhs, dfull)                  # g's backward
        dpart = C.tp_block_backward(caches[b], w[f"A{b}"], w[f"B{b}"], dfull,
                                    g[f"A{b}"], g[f"a{b}"], g[f"B{b}"])
        mine = np.empty((rows, d))
        with clock("comm"):
            tp.Reduce_scatter_block(dpart, mine, op=mod.SUM)  # f's backward
        dhs = dhs + mine
    C.relu_backward(dhs, z0)
    C.linear_backward(Xs, w["We"], dhs, g["We"], g["be"], need_dx=False)
    # the replicated weights saw only my rows: sum their gradients (and the loss) once
    rep = [key for key in w if key not in sharded_keys(blocks)]
    flat = np.concatenate([g[key].ravel() for key in rep] + [np.array([loss])])
    with clock("comm"):
        tp.Allreduce(mod.IN_PLACE, flat, op=mod.SUM)
    at = 0
    for key in rep:
        n = g[key].size
        g[key][...] = flat[at:at + n].reshape(g[key].shape)
        at += n
    return float(flat[-1])


def sgd(w, g, vel, lr, momentum, batch):
    """SGD with momentum on every array, the gradient divided by the global batch."""
    for key in w:
        vel[key] *= momentum
        vel[key] -= lr / batch * g[key]
        w[key] += vel[key]


def train(args, data, w0, variant="megatron", tp=None, mod=None, timer=None, rows=None):
    """Train ``args.steps`` steps from ``w0`` (this rank's shards); return (w, times).

    ``tp`` None: the single-process reference (``w0`` whole). ``rows`` picks this rank's
    part of every batch (the hybrid example's data-parallel shard), default all rows;
    ``args.dp`` (a communicator or None) then sums gradients over data-parallel replicas.
    ``times[s]`` is step s's ``{"step", "comm", "dp comm": seconds}`` on this rank
    (:func:`_training.step_medians` summarizes them).
    """
    X, y = data[0], data[1]
    w = {key: v.copy() for key, v in w0.items()}
    g = {key: np.zeros_like(v) for key, v in w.items()}
    vel = {key: np.zeros_like(v) for key, v in w.items()}
    clock = C.Clock(timer or C.time.perf_counter)
    dp = getattr(args, "dp", None)
    sync = getattr(args, "world", None) or tp   # a barrier before each step: its own time
    times = []
    for batch in C.full_batches(len(y), args.batch_size, args.seed, args.steps):
        if sync is not None:
            sync.Barrier()
        clock.total.clear()
        t0 = clock.timer()
        mine = batch if rows is None else rows(batch)
        if variant == "megatron" or tp is None:
            logits, cache = forward(w, X[mine], args.blocks, tp, mod, clock)
            loss, dlogits = C.softmax_xent(logits, y[mine])
            backward(w, g, cache, dlogits, args.blocks, tp, mod, clock)
        else:
            step_sequence_parallel(w, g, X[mine], y[mine], args.blocks, tp, mod, clock)
        if dp is not None and dp.size > 1:
            flat = np.concatenate([g[key].ravel() for key in g])
            with clock("dp comm"):
                dp.Allreduce(mod.IN_PLACE, flat, op=mod.SUM)
            at = 0
            for key in g:
                g[key][...] = flat[at:at + g[key].size].reshape(g[key].shape)
                at += g[key].size
        sgd(w, g, vel, args.lr, args.momentum, len(batch))
        times.append({"step": clock.timer() - t0, **clock.total})
    return w, times


def main(argv=None) -> int:
    """Train both variants, check against the unsplit model, report; exit status."""
    def add(ap):
        ap.add_argument("--width", type=int, default=None, help="d (the MLP's inner is 4d)")
        ap.add_argument("--blocks", type=int, default=2, help="Megatron MLP blocks")
        ap.add_argument("--steps", type=int, default=None, help="SGD steps per variant")
        ap.add_argument("--lr", type=float, default=0.05)
        ap.add_argument("--momentum", type=float, default=0.9)

    args = C.parse_args(__doc__.splitlines()[0], add, argv)
    args.width = args.width or (32 if args.small else 256)
    args.steps = args.steps or (4 if args.small else 10)
    mod, comm = C.world()
    rank, size = comm.rank, comm.size
    if args.batch_size % size:
        raise SystemExit(f"--batch-size {args.batch_size} must divide by the {size} ranks "
                         "(the sequence-parallel variant splits each batch's rows)")
    data = C.load_data(args.seed, comm=comm)
    wire = C.WireCounter(comm)
    full0 = full_init(args.width, args.blocks, args.seed)
    mine0 = shard(full0, args.blocks, rank, size)
    n_full = sum(v.size for v in full0.values())
    n_mine = sum(v.size for v in mine0.values())
    B, d = args.batch_size, args.width
    if rank == 0:
        print(f"model 64-{d}-[{args.blocks} x ({d}-{4 * d}-{d}, residual)]-10: {n_full} "
              f"params, {n_mine} on each of {size} ranks; batch {B}, {args.steps} steps "
              f"(first untimed)", flush=True)

    ok = True
    # outputs equal before any training: a forward pass of the split model
    ref_logits0, _ = forward(full0, data[2], args.blocks)
    tp_logits0, _ = forward(mine0, data[2], args.blocks, comm, mod)
    good, gap = C.close(tp_logits0, ref_logits0)
    ok &= C.check(rank, bool(comm.allreduce(int(good), op=mod.MIN)),
                  f"test-set logits of the split model equal the unsplit one's "
                  f"(rank 0: max rel. diff {gap:.2g})")

    ref, ref_times = train(args, data, full0)
    ref_step = C.step_medians([ref_times])["step"]
    ref_logits, _ = forward(ref, data[2], args.blocks)
    act = B * d * 8                                   # one block's activations, bytes
    rows_out = []
    for variant in ("megatron", "sequence"):
        wire.take()
        w, times = train(args, data, mine0, variant, comm, mod, mod.Wtime)
        sent, msgs = wire.take()
        whole = unshard(w, args.blocks, comm)
        worst = max(C.close(whole[key], ref[key])[1] for key in ref)
        logits, _ = forward(w, data[2], args.blocks, comm, mod)
        lgood, lgap = C.close(logits, ref_logits)
        every = comm.gather((worst, lgap, times, sent), root=0)
        if rank == 0:
            worst = max(e[0] for e in every)
            ok &= C.check(rank, worst <= 1e-9,
                          f"{variant}: every weight after {args.steps} steps equals the "
                          f"unsplit single-process model's (max rel. diff {worst:.2g})")
            lworst = max(e[1] for e in every)
            acc = C.accuracy(logits, data[3])
            ok &= C.check(rank, lworst <= 1e-9,
                          f"{variant}: test-set logits after training equal the unsplit "
                          f"model's (max rel. diff {lworst:.2g}; test accuracy {acc:.3f})")
            med = C.step_medians([e[2] for e in every])
            step_ms, comm_ms = med["step"] * 1e3, med["comm"] * 1e3
            per_step = np.mean([e[3] for e in every]) / args.steps
            if variant == "megatron":
                formula = 2 * args.blocks * C.allreduce_bytes(
                    comm.chosen_algorithm("allreduce", act), act, size)
                text = "2 x blocks all-reduces of B*d"
            else:
                rep = 8 * sum(v.size for key, v in full0.items()
                              if key not in sharded_keys(args.blocks))
                formula = (2 * args.blocks * (C.half_ring_bytes(comm, "allgather", act) +
                                              C.half_ring_bytes(comm, "reduce_scatter_block",
                                                                act))
                           + C.allreduce_bytes(comm.chosen_algorithm("allreduce", rep + 8),
                                               rep + 8, size))
                text = "2 x blocks x (AG + RS) of B*d, + replicated grads"
            rows_out.append((variant, step_ms, comm_ms, per_step, formula, text))
    if rank == 0:
        print(f"single process, unsplit: {ref_step * 1e3:.1f} ms/step")
        print(f"{'variant':<9} {'step ms':>8} {'comm ms':>8} {'share':>6} "
              f"{'sent/rank/step':>15} {'formula':>10}")
        for variant, step_ms, comm_ms, per_step, formula, text in rows_out:
            print(f"{variant:<9} {step_ms:8.2f} {comm_ms:8.2f} {comm_ms / step_ms:6.1%} "
                  f"{C.mib(per_step):>15} {C.mib(formula):>10}  ({text})")
        print("(medians over the steps after the first: step ms, the slowest rank's; comm ms, "
              "time inside the collectives, the mean over ranks)", flush=True)
        ok &= C.check(rank, all(np.isclose(r[3], r[4]) for r in rows_out),
                      "bytes sent per rank per step equal the formulas")
    return C.finish(comm, ok)


if __name__ == "__main__":
    sys.exit(main())
