"""Scratch buffers that collective schedules reuse from one call to the next.

Why: a schedule such as the recursive-doubling all-reduce needs ``n`` bytes of scratch per
call (Rabenseifner's needed ``n/2`` before its exchanges were segmented).
Allocated afresh with numpy, a buffer of 32 MiB or more comes straight from ``mmap`` (glibc
serves allocations above its largest dynamic mmap threshold, 32 MiB on 64-bit Linux, that
way and unmaps them on free), so every call page-faults on all of its pages again (the
times with and without reuse: benchmarks/README.md, "Measurements behind design choices in
the code"). Open MPI and MPICH keep such buffers too (MPICH's ``MPIR_Localcopy`` scratch,
NCCL its fixed buffers).

Contract: :func:`take` hands out a buffer no one else holds until it is given back with
:func:`give`; a schedule gives back what it took when it has finished with it (after every
request that touches it has completed). A buffer that is never given back (an exception
mid-schedule) is simply garbage-collected. Buffers under :data:`POOL_MIN_BYTES` (128 KiB,
glibc's initial ``M_MMAP_THRESHOLD``) are plain ``np.empty``, served from the heap. Larger
ones are pooled, from 128 KiB on and not only from 32 MiB: when a schedule frees a megabyte
at the top of the heap, glibc trims it back to the kernel and the next call faults the
pages in again (a 1 MiB all-reduce's receive segments, ibid.). At most
``PYCOMM_SCRATCH_KEEP_BYTES`` bytes of free buffers are kept (0 keeps none). Thread-safe:
nonblocking collectives run on a progress thread beside blocking ones.
"""

from __future__ import annotations

import threading

import numpy as np

from pycomm import config

__all__ = ["POOL_MIN_BYTES", "ScratchPool", "take", "give"]

POOL_MIN_BYTES = 1 << 17
_ALIGN = 1 << 16


class ScratchPool:
    """Free scratch buffers of one process, best fit first.

    Args:
        keep_bytes: most bytes of free buffers kept; None reads
            ``PYCOMM_SCRATCH_KEEP_BYTES`` at each :meth:`give`.
    """

    def __init__(self, keep_bytes: int | None = None):
        self._keep = keep_bytes
        self._free: list[np.ndarray] = []           # uint8 bases, not handed out
        self._owned: dict[int, np.ndarray] = {}     # id(base) -> base, handed out or free
        self._lock = threading.Lock()

    @property
    def free_bytes(self) -> int:
        """Bytes of the buffers waiting to be reused."""
        return sum(b.nbytes for b in self._free)

    def take(self, count: int, dtype) -> np.ndarray:
        """Return a 1-D array of ``count`` elements of ``dtype``, contents undefined.

        Raises:
            ValueError: ``count`` is negative.
        """
        dtype = np.dtype(dtype)
        if count < 0:
            raise ValueError(f"scratch of {count} elements")
        nbytes = count * dtype.itemsize
        if nbytes < POOL_MIN_BYTES:
            return np.empty(count, dtype=dtype)
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if b.nbytes >= nbytes]
            if fits:
                base = self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
            else:
                base = np.empty(-(-nbytes // _ALIGN) * _ALIGN, dtype=np.uint8)
                self._owned[id(base)] = base
        return base[:nbytes].view(dtype)

    def give(self, arr: np.ndarray) -> None:
        """Return a buffer from :meth:`take` (or any view of one); others are ignored."""
        b = arr
        while b is not None and id(b) not in self._owned:
            b = b.base if isinstance(b, np.ndarray) else None
        if b is None:
            return
        keep = config.get("PYCOMM_SCRATCH_KEEP_BYTES") if self._keep is None else self._keep
        with self._lock:
            base = self._owned.get(id(b))
            if base is not b or any(f is b for f in self._free):
                return                               # not ours, or given back twice
            if self.free_bytes + b.nbytes <= keep:
                self._free.append(b)
            else:
                del self._owned[id(b)]

    def clear(self) -> None:
        """Drop every free buffer (handed-out ones are dropped when given back)."""
        with self._lock:
            for b in self._free:
                self._owned.pop(id(b), None)
            self._free.clear()


POOL = ScratchPool()


# this process's pool's methods, bound once (small calls should not pay a second frame)
take = POOL.take
give = POOL.give
