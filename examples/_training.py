"""What the parallel-training examples share: the world, the data, numpy MLP layers, timing.

Every example in this folder trains a small numpy model on scikit-learn's bundled digits
(1797 8x8 images, 10 classes; shipped inside the package, no download) with one parallel
scheme, re-runs the same training in one process with no communication, asserts that the
two agree, and prints PASS. This module holds the pieces they have in common so that each
example file shows only its scheme:

* :func:`world` — ``(pycomm, COMM_WORLD)`` from a checkout, with the BLAS pinned to one
  thread per rank (2 cores shared by 4 ranks are oversubscribed already);
* :func:`parse_args` — the options every example takes (``--small`` or
  ``PYCOMM_EXAMPLES_SMALL=1`` picks the tiny sizes the tests run);
* :func:`load_data`, :func:`full_batches` — the standardized split and the batch order;
* :class:`Params` and the layer functions — a flat float64 buffer viewed as (W, b) pairs,
  :func:`linear_forward`, :func:`linear_backward`, :func:`relu_backward`,
  :func:`softmax_xent`, :func:`mlp_forward`, :func:`mlp_backward`;
* Megatron-LM's tensor-parallel block (Shoeybi et al. 2019, arXiv:1909.08053):
  :func:`tp_block_forward`, :func:`tp_block_backward`, shared by ``tensor_parallel.py``
  and ``hybrid_parallel.py``;
* :class:`WireCounter` — payload bytes and messages this rank hands to the transports;
* :class:`Clock`, :func:`check`, :func:`finish`, :func:`ring_allreduce_bytes` — timing,
  the PASS/FAIL lines and the exit status, and the one traffic formula most examples print.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import dataclass

# One BLAS thread per rank: the ranks already outnumber the cores, and a single thread
# also keeps each matmul's summation order independent of the machine's load.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402  (after the thread pinning above)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_ENV = "PYCOMM_EXAMPLES_SMALL"


def world():
    """Return ``(pycomm, pycomm.COMM_WORLD)``, importing pycomm from this checkout."""
    if ROOT not in sys.path:  # run from a checkout without installing pycomm
        sys.path.insert(0, ROOT)
    import pycomm
    return pycomm, pycomm.COMM_WORLD


def parse_args(description: str, add=None, argv=None) -> argparse.Namespace:
    """The options every example takes, plus those ``add(parser)`` adds.

    ``args.small`` is True with ``--small`` or ``PYCOMM_EXAMPLES_SMALL=1``: each example
    then shrinks its model and step count so that the test suite can run it in seconds.
    """
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--small", action="store_true",
                    default=os.environ.get(SMALL_ENV, "") not in ("", "0"),
                    help=f"tiny sizes for the tests (also {SMALL_ENV}=1)")
    ap.add_argument("--seed", type=int, default=0, help="seed of split, init and batches")
    ap.add_argument("--batch-size", type=int, default=128, help="global batch (default 128)")
    if add is not None:
        add(ap)
    return ap.parse_args(argv)


# --------------------------------------------------------------------------- data


def load_data(seed: int, test_fraction: float = 0.2, comm=None):
    """Return standardized (X_train, y_train, X_test, y_test); the same on every rank.

    X arrays are float64 of shape (n, 64); y arrays are int64 class labels 0..9. With
    ``comm`` (pycomm's or mpi4py's) of more than one rank, rank 0 reads the digits and
    broadcasts them (an object ``bcast``): importing scikit-learn on every rank costs more
    CPU than the broadcast, and ranks share cores. Call it before a :class:`WireCounter`
    starts counting, so that the broadcast is not counted as the scheme's traffic.
    """
    if comm is not None and comm.Get_size() > 1:
        X, y = comm.bcast(_digits() if comm.Get_rank() == 0 else None, root=0)
    else:
        X, y = _digits()
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = order[:n_test], order[n_test:]
    mean = X[train].mean(axis=0)
    std = X[train].std(axis=0)
    std[std == 0] = 1.0  # the always-blank border pixels
    scale = lambda a: (a - mean) / std  # noqa: E731
    return scale(X[train]), y[train].astype(np.int64), scale(X[test]), y[test].astype(np.int64)


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: X float64 (1797, 64), y int (1797,)."""
    from sklearn.datasets import load_digits

    return load_digits(return_X_y=True)


def batches(n: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Cut this epoch's permutation of range(n) into global batches (last one shorter)."""
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def full_batches(n: int, batch_size: int, seed: int, steps: int) -> list[np.ndarray]:
    """The first ``steps`` full batches of consecutive epochs (short tails dropped).

    Schemes that split a batch into equal parts (micro-batches, row shards for a
    reduce-scatter) need every batch to be exactly ``batch_size`` rows.
    """
    out, epoch = [], 0
    while len(out) < steps:
        out += [b for b in batches(n, batch_size, seed, epoch) if len(b) == batch_size]
        epoch += 1
    return out[:steps]


# --------------------------------------------------------------------------- layers


@dataclass
class Params:
    """A flat float64 buffer viewed as the (W, b) pair of each linear layer.

    ``W[i]`` has shape (dims[i], dims[i+1]) and ``b[i]`` (dims[i+1],); layer i's two views
    are contiguous and follow layer i-1's, so a run of layers is one slice of ``flat``
    (:meth:`span`), which is what buckets and shards are cut from.
    """

    flat: np.ndarray
    W: list
    b: list
    offsets: list  # offsets[i]: where layer i starts in flat; offsets[-1] == flat.size

    @classmethod
    def over(cls, flat: np.ndarray, dims) -> "Params":
        """View ``flat`` (at least :meth:`count` long) as the layers of ``dims``."""
        W, b, offsets, at = [], [], [0], 0
        for din, dout in zip(dims[:-1], dims[1:]):
            W.append(flat[at:at + din * dout].reshape(din, dout))
            at += din * dout
            b.append(flat[at:at + dout])
            at += dout
            offsets.append(at)
        return cls(flat, W, b, offsets)

    @staticmethod
    def count(dims) -> int:
        """Number of parameters of the layers of ``dims``."""
        return sum(a * c + c for a, c in zip(dims[:-1], dims[1:]))

    def span(self, first: int, last: int) -> slice:
        """The slice of ``flat`` holding layers ``first`` .. ``last`` (inclusive)."""
        return slice(self.offsets[first], self.offsets[last + 1])


def init_mlp(dims, seed: int) -> np.ndarray:
    """He-initialized flat parameters for the layers of ``dims`` (biases zero)."""
    rng = np.random.default_rng(seed)
    flat = np.zeros(Params.count(dims))
    p = Params.over(flat, dims)
    for W in p.W:
        W[...] = rng.normal(0.0, np.sqrt(2.0 / W.shape[0]), size=W.shape)
    return flat


def linear_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """``x @ W + b``: x (n, din), W (din, dout), b (dout,) or None."""
    z = x @ W
    if b is not None:
        z += b
    return z


def linear_backward(x, W, dz, dW, db, need_dx: bool = True):
    """Write the gradients of ``z = x @ W + b`` into dW (and db unless None); return dx.

    Args:
        x: the layer's input (n, din); W: its weight (din, dout); dz: dL/dz (n, dout).
        dW, db: output views (db None for a layer without bias).
        need_dx: False for the first layer, whose input gradient nobody needs.
    """
    np.matmul(x.T, dz, out=dW)
    if db is not None:
        dz.sum(axis=0, out=db)
    return dz @ W.T if need_dx else None


def relu_backward(dy: np.ndarray, z: np.ndarray) -> np.ndarray:
    """dL/dz of ``y = relu(z)`` given dL/dy (modifies and returns dy)."""
    dy[z <= 0.0] = 0.0
    return dy


def softmax_xent(logits: np.ndarray, y: np.ndarray):
    """Summed cross-entropy of ``logits`` (n, k) against labels ``y``; returns (loss, dlogits).

    The loss is summed, not averaged, so that shards of a batch add up to the batch: the
    caller divides by the global batch size.
    """
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    probs = e / e.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss = float(-np.log(probs[rows, y]).sum())
    probs[rows, y] -= 1.0
    return loss, probs


def mlp_forward(p: Params, X: np.ndarray, first: int = 0, last: int | None = None):
    """Run layers ``first..last`` (ReLU between layers, none after the model's last).

    Returns ``(out, cache)``; ``cache[i]`` is (input, pre-activation) of layer i, what
    :func:`mlp_backward` needs.
    """
    n_layers = len(p.W)
    last = n_layers - 1 if last is None else last
    cache, h = [], X
    for i in range(first, last + 1):
        z = linear_forward(h, p.W[i], p.b[i])
        cache.append((h, z))
        h = np.maximum(z, 0.0) if i < n_layers - 1 else z
    return h, cache


def mlp_backward(p: Params, g: Params, cache, dout: np.ndarray, first: int = 0,
                 on_layer=None, need_dx: bool = False):
    """Back-propagate ``dout`` through layers ``first..first+len(cache)-1``, last first.

    Writes each layer's gradient into ``g``; calls ``on_layer(i)`` as soon as layer i's
    gradient is complete (what a bucketed all-reduce hooks into). Returns dL/d(input) when
    ``need_dx`` (a pipeline stage sends it upstream), else None.
    """
    n_layers = len(p.W)
    d = dout
    for j in range(len(cache) - 1, -1, -1):
        i = first + j
        x, z = cache[j]
        if i < n_layers - 1:
            d = relu_backward(d, z)
        d = linear_backward(x, p.W[i], d, g.W[i], g.b[i], need_dx=(j > 0 or need_dx))
        if on_layer is not None:
            on_layer(i)
    return d


def accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    """Fraction of rows whose arg-max logit is the label."""
    return float((logits.argmax(axis=1) == y).mean())


# ----------------------------------------------------------- Megatron tensor parallel


def tp_block_forward(h, A, a, B):
    """One Megatron-LM MLP block's local part: ``relu(h @ A_i + a_i) @ B_i``.

    A is split by columns (column-parallel: rank i holds A[:, cols_i] and a[cols_i]) and
    B by rows (row-parallel: B[rows_i, :]), so the relu needs no communication and the
    block's output is the *sum* over ranks of what this returns: the caller all-reduces
    it (Megatron's operator g), or reduce-scatters it in the sequence-parallel variant.

    Returns ``(partial_out, cache)``; partial_out has h's shape.
    """
    z = linear_forward(h, A, a)
    r = np.maximum(z, 0.0)
    return r @ B, (h, z, r)


def tp_block_backward(cache, A, B, dout, dA, da, dB):
    """Gradients of the local block given dL/d(block output) (full, replicated).

    Writes dA, da, dB (this rank's shards); returns this rank's *partial* dL/dh, which the
    caller sums over the tensor-parallel ranks (Megatron's operator f in backward).
    """
    h, z, r = cache
    np.matmul(r.T, dout, out=dB)
    dr = relu_backward(dout @ B.T, z)
    return linear_backward(h, A, dr, dA, da)


# --------------------------------------------------------------------------- measuring


class WireCounter:
    """Counts the payload bytes and messages this rank's engine sends to other ranks.

    Reads the engine's counters (``sent_bytes``, ``sent_messages``: every message sent
    to another rank, point-to-point or inside a collective's message algorithm, counted
    where it leaves the engine, whatever the protocol). Bytes are payloads (headers
    excluded), as the literature's formulas count them; calls through shared-memory
    slots or direct reads send no message.
    """

    def __init__(self, comm):
        self.engine = eng = comm._engine
        self._bytes, self._messages = eng.sent_bytes, eng.sent_messages

    def take(self) -> tuple[int, int]:
        """Return (bytes, messages) sent since the last call, and start counting afresh."""
        eng = self.engine
        b, m = eng.sent_bytes, eng.sent_messages
        out = (b - self._bytes, m - self._messages)
        self._bytes, self._messages = b, m
        return out


class Clock:
    """Accumulates wall time per named phase: ``with clock("comm"): ...``."""

    def __init__(self, timer=time.perf_counter):
        self.timer = timer
        self.total: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = self.timer()
        try:
            yield
        finally:
            self.add(name, self.timer() - t0)

    def add(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to phase ``name``."""
        self.total[name] = self.total.get(name, 0.0) + seconds

    def get(self, name: str) -> float:
        """Seconds accumulated in ``name`` (0 if never timed)."""
        return self.total.get(name, 0.0)


def ring_allreduce_bytes(n_bytes: int, p: int) -> float:
    """Bytes each rank sends in a bandwidth-optimal all-reduce of ``n_bytes``: 2(p-1)/p·N.

    Ring (Patarasuk & Yuan 2009) and Rabenseifner's reduce-scatter + all-gather both
    reach it; recursive doubling sends log2(p)·N instead.
    """
    return 2.0 * (p - 1) / p * n_bytes


def half_ring_bytes(comm, collective: str, n_bytes: int) -> float:
    """Bytes each rank sends in an all-gather (``n_bytes``: the gathered whole) or a
    reduce-scatter (``n_bytes``: each rank's input) on ``comm``: (p-1)/p·N by messages
    (ring, Patarasuk & Yuan 2009); none where the call goes through shared-memory slots
    (``comm.chosen_algorithm`` says ``shared_slots``: each rank writes its own slot and
    its peers read it in place) or by direct reads (``shm_direct``: the peers read its
    buffer), where no message is sent.
    """
    if comm.chosen_algorithm(collective, n_bytes) in ("shared_slots", "shm_direct"):
        return 0.0
    return (comm.size - 1) / comm.size * n_bytes


def mib(n: float) -> str:
    """``n`` bytes as a short MiB string."""
    return f"{n / 2**20:.2f} MiB"


def check(rank: int, ok: bool, what: str) -> bool:
    """Print ``PASS: what`` or ``FAIL: what`` on rank 0; return ``ok``."""
    if rank == 0:
        print(f"{'PASS' if ok else 'FAIL'}: {what}", flush=True)
    return bool(ok)


def finish(comm, ok: bool) -> int:
    """Agree on success over all ranks (any rank's failure fails all); print the verdict.

    Returns the process exit status (0 on PASS).
    """
    flag = np.array([1 if ok else 0], dtype=np.int64)
    out = np.empty_like(flag)
    from pycomm import MIN  # noqa: PLC0415  (world() has put the checkout on sys.path)
    comm.Allreduce(flag, out, op=MIN)
    if comm.rank == 0:
        print("PASS" if out[0] else "FAIL", flush=True)
    return 0 if out[0] else 1


def close(a: np.ndarray, b: np.ndarray, rtol: float = 1e-9) -> tuple[bool, float]:
    """Whether a equals b within ``rtol`` of b's largest magnitude; and the relative gap."""
    scale = max(float(np.max(np.abs(b))), 1e-300)
    gap = float(np.max(np.abs(a - b))) / scale if a.size else 0.0
    return gap <= rtol, gap


def allreduce_bytes(algorithm: str, n_bytes: int, p: int) -> float:
    """Mean bytes a rank sends in an all-reduce of ``n_bytes`` by ``algorithm``.

    Recursive doubling (Thakur et al. 2005) exchanges the whole vector log2(q) times among
    the q = 2^floor(log2 p) ranks left after the non-power-of-two fold, which costs the
    p - q folded pairs N in and N out: (2(p - q) + q·log2 q)/p · N. Ring, Rabenseifner
    (its fold included), binomial reduce + broadcast and the double binary tree all move
    every byte across p - 1 links on the way in and p - 1 on the way out: 2(p-1)/p·N on
    average (the trees unevenly). Through shared-memory slots (``shared_slots``, small
    calls on one host) a rank sends no message at all, nor by direct reads
    (``shm_direct``, large calls on one host: the peers read its buffers).
    """
    if p == 1 or algorithm in ("shared_slots", "shm_direct"):     # no message sent
        return 0.0
    if algorithm == "recursive_doubling":
        q = 1 << (p.bit_length() - 1)
        return (2 * (p - q) + q * (q.bit_length() - 1)) / p * n_bytes
    return ring_allreduce_bytes(n_bytes, p)


def sgd_reference(dims, flat0, X, y, steps_batches, lr: float, momentum: float):
    """The single-process reference: whole batches, SGD with momentum, no communication.

    Returns (final flat parameters, summed loss of each step's batch).
    """
    params = flat0.copy()
    grads = np.zeros_like(params)
    vel = np.zeros_like(params)
    p, g = Params.over(params, dims), Params.over(grads, dims)
    losses = []
    for batch in steps_batches:
        out, cache = mlp_forward(p, X[batch])
        loss, dlogits = softmax_xent(out, y[batch])
        mlp_backward(p, g, cache, dlogits)
        grads /= len(batch)
        vel *= momentum
        vel -= lr * grads
        params += vel
        losses.append(loss)
    return params, losses


def step_medians(per_rank, skip: int = 1) -> dict:
    """Summarize per-step phase times gathered from every rank.

    Args:
        per_rank: ``per_rank[r][s]`` is rank r's ``{phase: seconds}`` of step s; phase
            ``"step"`` is the whole step.
        skip: leading warm-up steps to leave out.

    Returns:
        ``{phase: median over steps of (the slowest rank for "step", the mean over ranks
        otherwise)}``. Medians, because on a shared machine a step now and then takes
        several times longer.
    """
    names = sorted(set().union(*(d.keys() for rows in per_rank for d in rows)))
    out = {}
    for name in names:
        vals = []
        for s in range(skip, len(per_rank[0])):
            xs = [rows[s].get(name, 0.0) for rows in per_rank]
            vals.append(max(xs) if name == "step" else sum(xs) / len(xs))
        out[name] = float(np.median(vals)) if vals else 0.0
    return out
