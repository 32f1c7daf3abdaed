"""The scratch pool collective schedules reuse buffers from (pycomm.collectives.scratch)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pycomm.collectives.scratch import POOL_MIN_BYTES, ScratchPool

MB = 1 << 20


def test_small_buffers_are_plain_allocations():
    pool = ScratchPool(keep_bytes=64 * MB)
    a = pool.take(10, np.float32)
    assert a.shape == (10,) and a.dtype == np.float32
    pool.give(a)
    assert pool.free_bytes == 0


def test_large_buffers_are_reused_best_fit_and_never_shared():
    pool = ScratchPool(keep_bytes=64 * MB)
    a = pool.take(MB, np.float64)                  # 8 MiB
    b = pool.take(MB // 2, np.float32)             # 2 MiB
    assert a.nbytes == 8 * MB and b.nbytes == 2 * MB and a.dtype == np.float64
    assert not np.shares_memory(a, b)
    a_addr, b_addr = a.ctypes.data, b.ctypes.data
    pool.give(a[: 10])                             # any view of the buffer gives it back
    pool.give(b)
    c = pool.take(POOL_MIN_BYTES // 4, np.int32)   # the smaller free buffer fits best
    assert c.ctypes.data == b_addr
    d = pool.take(3 * MB // 8, np.float64)         # 3 MiB: only the 8 MiB one fits
    assert d.ctypes.data == a_addr
    e = pool.take(MB // 4, np.float64)             # none free: a new one
    assert not np.shares_memory(e, d) and not np.shares_memory(e, c)


def test_keep_limit_and_foreign_or_double_gives():
    pool = ScratchPool(keep_bytes=3 * MB)
    a, b = pool.take(2 * MB, np.uint8), pool.take(2 * MB, np.uint8)
    pool.give(a)
    pool.give(b)                                   # over the limit: dropped
    assert pool.free_bytes == 2 * MB
    pool.give(a)                                   # twice: ignored
    pool.give(np.empty(4 * MB, np.uint8))          # not the pool's: ignored
    assert pool.free_bytes == 2 * MB
    pool.clear()
    assert pool.free_bytes == 0
    assert ScratchPool(keep_bytes=0).take(2 * MB, np.uint8).nbytes == 2 * MB
    with pytest.raises(ValueError):
        pool.take(-1, np.uint8)


def test_threads_never_get_the_same_buffer():
    pool = ScratchPool(keep_bytes=64 * MB)
    held, lock, errors = set(), threading.Lock(), []

    def worker():
        try:
            for _ in range(200):
                buf = pool.take(MB // 4, np.float64)
                with lock:
                    if buf.ctypes.data in held:
                        errors.append("shared")
                    held.add(buf.ctypes.data)
                buf[:] = 1.0
                with lock:
                    held.discard(buf.ctypes.data)
                pool.give(buf)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
