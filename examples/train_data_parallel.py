"""Data-parallel training of a small MLP on scikit-learn's digits, checked against one process.

What it does, on every rank:

1. Loads the bundled digits data (1797 images of 8x8 pixels, 10 classes), splits it 80/20
   with a fixed seed and standardizes the features with the training mean and deviation.
   Every rank computes the same split locally; no data moves.
2. Rank 0 initializes the MLP (64 inputs -> ``--hidden`` ReLU units -> 10 logits, He
   initialization) in one flat float64 buffer; ``comm.Bcast`` sends it to every rank (the
   other ranks start from NaN, so a broadcast that does not arrive cannot go unnoticed).
3. Each epoch draws one permutation from ``--seed`` and the epoch number (identical on all
   ranks) and cuts it into global batches of ``--batch-size``. Rank r takes
   ``np.array_split(batch, size)[r]``, so any world size works, even one that does not
   divide the batch (a rank may get an empty shard).
4. Each rank computes the gradient of the *sum* of its shard's losses into one contiguous
   float64 buffer (with the loss sum in its last slot), ``comm.Allreduce(IN_PLACE, grad,
   op=SUM)`` adds the shards, and every rank divides by the global batch size. That is the
   full-batch mean gradient exactly (up to summation order), whatever the shard sizes.
5. SGD with momentum updates the weights identically on every rank.

At the end it checks that every rank holds bit-identical weights (``comm.gather`` to rank
0), that they equal (``np.allclose``, rtol 1e-9) the weights of the whole training re-run
in one process on full batches with no communication, and that the test accuracy reaches
``--min-accuracy``; it prints PASS/FAIL lines and every rank exits 1 on any failure.
It also reports the time per step split into compute and allreduce, averaged over ranks.

Run::

    python launch.py -n 4 examples/train_data_parallel.py           # pycomm
    mpiexec -n 4 python examples/train_data_parallel.py --mpi4py    # mpi4py reference

Requires the ``examples`` extra (scikit-learn, tqdm); without tqdm there is no bar.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from dataclasses import dataclass

import numpy as np


def select_comm(use_mpi4py: bool):
    """Return (module, COMM_WORLD) for pycomm, or for mpi4py.MPI when asked."""
    if use_mpi4py:
        from mpi4py import MPI
        return MPI, MPI.COMM_WORLD
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:  # run from a checkout without installing pycomm
        sys.path.insert(0, root)
    import pycomm
    return pycomm, pycomm.COMM_WORLD


# --------------------------------------------------------------------------- data

# The split and the batch order are the ones every example in this folder uses.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _training import batches, load_data  # noqa: E402,F401  (re-exported for the tests)


# --------------------------------------------------------------------------- model


@dataclass
class MLP:
    """Views into one flat float64 parameter buffer: W1 (d, h), b1 (h), W2 (h, k), b2 (k)."""

    flat: np.ndarray
    W1: np.ndarray
    b1: np.ndarray
    W2: np.ndarray
    b2: np.ndarray

    @staticmethod
    def shapes(d: int, h: int, k: int) -> list[tuple[int, ...]]:
        """Shapes of W1, b1, W2, b2, in buffer order."""
        return [(d, h), (h,), (h, k), (k,)]

    @classmethod
    def over(cls, flat: np.ndarray, d: int, h: int, k: int) -> "MLP":
        """Wrap ``flat`` (at least the parameter count long) as an MLP of views."""
        views, at = [], 0
        for shape in cls.shapes(d, h, k):
            n = int(np.prod(shape))
            views.append(flat[at:at + n].reshape(shape))
            at += n
        return cls(flat, *views)

    @classmethod
    def count(cls, d: int, h: int, k: int) -> int:
        """Return the number of parameters."""
        return sum(int(np.prod(s)) for s in cls.shapes(d, h, k))


def init_params(d: int, h: int, k: int, seed: int) -> np.ndarray:
    """He-initialized flat parameter vector (float64, biases zero)."""
    rng = np.random.default_rng(seed)
    flat = np.zeros(MLP.count(d, h, k))
    m = MLP.over(flat, d, h, k)
    m.W1[...] = rng.normal(0.0, np.sqrt(2.0 / d), size=(d, h))
    m.W2[...] = rng.normal(0.0, np.sqrt(2.0 / h), size=(h, k))
    return flat


def loss_and_grad_sum(p: MLP, X: np.ndarray, y: np.ndarray, g: MLP) -> float:
    """Write into ``g`` the gradient of the summed cross-entropy over (X, y); return the sum.

    Summing (not averaging) makes shard results add up to the batch result; the caller
    divides by the global batch size. An empty shard gives a zero gradient and loss 0.
    """
    z1 = X @ p.W1 + p.b1
    a1 = np.maximum(z1, 0.0)
    logits = a1 @ p.W2 + p.b2
    logits -= logits.max(axis=1, keepdims=True)
    expo = np.exp(logits)
    probs = expo / expo.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss = float(-np.log(probs[rows, y]).sum())
    dlogits = probs
    dlogits[rows, y] -= 1.0
    g.W2[...] = a1.T @ dlogits
    g.b2[...] = dlogits.sum(axis=0)
    da1 = dlogits @ p.W2.T
    da1[z1 <= 0.0] = 0.0
    g.W1[...] = X.T @ da1
    g.b1[...] = da1.sum(axis=0)
    return loss


def accuracy(p: MLP, X: np.ndarray, y: np.ndarray) -> float:
    """Fraction of rows of X whose arg-max logit is the label."""
    logits = np.maximum(X @ p.W1 + p.b1, 0.0) @ p.W2 + p.b2
    return float((logits.argmax(axis=1) == y).mean())


# --------------------------------------------------------------------------- training


def train(args, data, flat0: np.ndarray, rank: int = 0, size: int = 1, comm=None, mod=None,
          on_epoch=None, timer=time.perf_counter):
    """Run the whole training from ``flat0``; return (final flat params, timings).

    With ``comm`` None this is the single-process reference: every global batch is used
    whole. Otherwise rank ``rank`` of ``size`` uses its shard and Allreduces the gradient.

    Returns:
        (params, (compute_seconds, comm_seconds, steps)).
    """
    X, y, Xt, yt = data
    d, h, k = X.shape[1], args.hidden, 10
    n_params = MLP.count(d, h, k)
    params = flat0.copy()
    p = MLP.over(params, d, h, k)
    gbuf = np.zeros(n_params + 1)  # gradient, then the loss sum in the last slot
    g = MLP.over(gbuf, d, h, k)
    velocity = np.zeros(n_params)
    t_compute = t_comm = 0.0
    steps = 0
    for epoch in range(args.epochs):
        epoch_loss, seen = 0.0, 0
        for batch in batches(len(y), args.batch_size, args.seed, epoch):
            t0 = timer()
            shard = batch if comm is None else np.array_split(batch, size)[rank]
            gbuf[-1] = loss_and_grad_sum(p, X[shard], y[shard], g)
            t1 = timer()
            if comm is not None:
                comm.Allreduce(mod.IN_PLACE, gbuf, op=mod.SUM)
            t2 = timer()
            gbuf /= len(batch)
            velocity *= args.momentum
            velocity -= args.lr * gbuf[:-1]
            params += velocity
            t3 = timer()
            t_compute += (t1 - t0) + (t3 - t2)
            t_comm += t2 - t1
            epoch_loss += gbuf[-1] * len(batch)
            seen += len(batch)
            steps += 1
        if on_epoch is not None:
            on_epoch(epoch, epoch_loss / seen, p)
    return params, (t_compute, t_comm, steps)


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=25, help="passes over the training set")
    ap.add_argument("--batch-size", type=int, default=128,
                    help="global mini-batch size, split across ranks (default 128)")
    ap.add_argument("--lr", type=float, default=0.05, help="learning rate (default 0.05)")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    ap.add_argument("--hidden", type=int, default=64, help="hidden units (default 64)")
    ap.add_argument("--seed", type=int, default=0, help="seed of split, init and batches")
    ap.add_argument("--min-accuracy", type=float, default=0.9,
                    help="fail below this final test accuracy (default 0.9)")
    ap.add_argument("--mpi4py", action="store_true",
                    help="use mpi4py.MPI (run under mpiexec) instead of pycomm")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    """Train data-parallel, verify, report; return the exit status (0 on PASS)."""
    args = parse_args(argv)
    mod, comm = select_comm(args.mpi4py)
    rank, size = comm.rank, comm.size
    data = load_data(args.seed, comm=comm)
    d, h = data[0].shape[1], args.hidden
    n_params = MLP.count(d, h, 10)

    # Rank 0 owns the initial weights; the others must receive them.
    flat0 = init_params(d, h, 10, args.seed) if rank == 0 else np.full(n_params, np.nan)
    comm.Bcast(flat0, root=0)

    bar, interactive = None, sys.stderr.isatty()
    if rank == 0:
        steps_per_epoch = -(-len(data[1]) // args.batch_size)
        print(f"digits: {len(data[1])} train / {len(data[3])} test, MLP 64-{h}-10 "
              f"({n_params} params), {size} ranks, global batch {args.batch_size} "
              f"({steps_per_epoch} steps/epoch), lr {args.lr}, momentum {args.momentum}",
              flush=True)
        try:
            from tqdm import tqdm

            # On a terminal the bar redraws in place; under a launcher that pipes and
            # prefixes output, \r-redraws would pile up on one line, so the bar is drawn
            # into a scratch buffer and its text printed with each epoch's line instead.
            sink = sys.stderr if interactive else io.StringIO()
            bar = tqdm(total=args.epochs, desc="epochs", unit="epoch", file=sink)
        except ImportError:
            pass

    history = []

    def on_epoch(epoch, loss, p):
        if rank != 0:
            return
        acc = accuracy(p, data[2], data[3])
        history.append(acc)
        line = f"epoch {epoch + 1:3d}/{args.epochs}  loss {loss:.4f}  test acc {acc:.4f}"
        if bar is None:
            print(line, flush=True)
        elif interactive:
            bar.set_postfix(loss=f"{loss:.4f}", acc=f"{acc:.4f}")
            bar.update(1)
            bar.write(line)
        else:
            bar.update(1)
            print(f"{line}  {bar}", flush=True)

    comm.Barrier()
    params, (t_compute, t_comm, steps) = train(args, data, flat0, rank, size, comm, mod,
                                               on_epoch, timer=mod.Wtime)
    if bar is not None:
        bar.close()

    # The single-process reference: every rank recomputes the whole training on full
    # batches from the broadcast weights at the same time (0.1 s of numpy), rather than
    # rank 0 alone while the others wait; an MPI that busy-polls on 2 cores slows a lone
    # rank 0 a hundredfold. Rank 0's reference starts from its own weights, and every
    # rank's trained weights must equal rank 0's, so this is still a check against one
    # process that never communicated.
    t0 = time.perf_counter()
    ref, _ = train(args, data, flat0)
    ref_seconds = time.perf_counter() - t0

    # Every rank's weights and timings go to rank 0, which judges.
    everything = comm.gather((params, t_compute, t_comm), root=0)
    ok = True
    if rank == 0:
        ok = report(args, params, ref, ref_seconds, everything, steps, history)
    status = np.array([0 if ok else 1], dtype=np.int64)
    comm.Bcast(status, root=0)
    return int(status[0])


def report(args, params, ref, ref_seconds, everything, steps, history) -> bool:
    """Print timings and PASS/FAIL checks on rank 0; return True when all pass.

    Args:
        args: the command-line options.
        params: rank 0's trained flat weights.
        ref: the flat weights of the single-process full-batch run.
        ref_seconds: how long that run took.
        everything: per rank (flat weights, compute seconds, allreduce seconds).
        steps: optimizer steps taken.
        history: rank 0's test accuracy after each epoch.

    """
    size = len(everything)
    compute = np.array([e[1] for e in everything]) / steps * 1e3
    comm_ms = np.array([e[2] for e in everything]) / steps * 1e3
    print(f"time per step (ms, mean over {size} ranks [min..max]): "
          f"compute {compute.mean():.3f} [{compute.min():.3f}..{compute.max():.3f}], "
          f"allreduce {comm_ms.mean():.3f} [{comm_ms.min():.3f}..{comm_ms.max():.3f}], "
          f"{steps} steps")

    ok = True
    worst = max(float(np.max(np.abs(e[0] - params))) for e in everything)
    same = all(np.array_equal(e[0], params) for e in everything)
    print(f"{'PASS' if same else 'FAIL'}: all {size} ranks hold identical weights "
          f"(max |diff| {worst:.3g})")
    ok &= same

    close = bool(np.allclose(params, ref, rtol=1e-9, atol=1e-12))
    rel = float(np.max(np.abs(params - ref)) / np.max(np.abs(ref)))
    print(f"{'PASS' if close else 'FAIL'}: weights match a single-process full-batch run "
          f"(max |diff| / max |w| = {rel:.3g}, rtol 1e-9; reference took "
          f"{ref_seconds:.2f} s)")
    ok &= close

    acc = history[-1] if history else 0.0
    good = acc >= args.min_accuracy
    print(f"{'PASS' if good else 'FAIL'}: test accuracy {acc:.4f} >= {args.min_accuracy}")
    ok &= good
    print("PASS" if ok else "FAIL", flush=True)
    return bool(ok)


if __name__ == "__main__":
    sys.exit(main())
