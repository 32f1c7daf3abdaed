"""The physical ceiling on this machine, measured with the same sizes and loops.

No communication library: one process times numpy copies, and two processes (this one and
a forked child) talk over a loopback TCP connection with plain Python sockets
(``TCP_NODELAY``; ``sendall`` to send, ``recv_into`` in a loop to receive), and through one
shared mapping with nothing but numpy copies and a spinning flag. Columns:

- memcpy GB/s: ``np.copyto(dst, src)`` of ``size`` bytes (10**9 bytes per second);
- add GB/s: ``np.add(a, b, out=c)`` on float32, bytes of one array per second — what
  the local reduction of an allreduce can reach;
- TCP latency µs: half the round trip of a ``size``-byte ping-pong (``osu_latency``'s loop);
- TCP stream MB/s: windows of 64 ``size``-byte messages then a 1-byte ack (``osu_bw``'s);
- shm latency µs: half the round trip of a ``size``-byte ping-pong through shared memory
  between two Python processes: the sender copies its buffer into the mapping and then
  stores a sequence word, the receiver spins on that word and copies the bytes out, and
  answers the same way. It is the least a message between two pure-Python ranks on this
  host costs (one copy in, one flag, one copy out, the interpreter's loop), the floor
  under pycomm's shared-memory latency as memcpy is under its bandwidth.

Iterations follow ``-i``/``-x`` (``--iter-large``/``--warmup-large`` past 8 KiB) for copies
and ping-pong, with osu_latency's defaults; the stream uses osu_bw's counts (100 timed and
10 warm-up windows up to 8 KiB, 20 and 2 past). ``--max-time`` defaults to 3 s here so
the multi-MiB ping-pongs do not dominate the run. No launcher is needed::

    python benchmarks/reference.py [-m 8:16777216] [--json ref.json]
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import socket
import struct
import sys
import time

import numpy as np
from _common import (
    LARGE_MESSAGE_SIZE,
    Report,
    loop_counts,
    make_parser,
    run_metadata,
    sizes_from_args,
)

WINDOW = 64
_CMD = struct.Struct("!iqq")  # mode, size, count
QUIT, PING_PONG, STREAM = 0, 1, 2


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; raise ConnectionError when the peer closes first."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n


def _peer(port: int, max_size: int) -> None:
    """Child process: connect, then serve ping-pong and stream commands until QUIT."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = memoryview(bytearray(max(max_size, 1)))
    cmd = memoryview(bytearray(_CMD.size))
    ack = b"k"
    while True:
        recv_exact(sock, cmd)
        mode, size, count = _CMD.unpack(cmd)
        if mode == QUIT:
            break
        view = buf[:size]
        if mode == PING_PONG:
            for _ in range(count):
                recv_exact(sock, view)
                sock.sendall(view)
        else:
            for _ in range(count):
                for _ in range(WINDOW):
                    recv_exact(sock, view)
                sock.sendall(ack)
    sock.close()


def tcp_run(sock: socket.socket, mode: int, size: int, count: int, buf: memoryview) -> float:
    """Drive ``count`` ping-pongs or stream windows of ``size`` bytes; return seconds."""
    sock.sendall(_CMD.pack(mode, size, count))
    view = buf[:size]
    ack = memoryview(bytearray(1))
    t0 = time.perf_counter()
    if mode == PING_PONG:
        for _ in range(count):
            sock.sendall(view)
            recv_exact(sock, view)
    else:
        for _ in range(count):
            for _ in range(WINDOW):
                sock.sendall(view)
            recv_exact(sock, ack)
    return time.perf_counter() - t0


class ShmPingPong:
    """A forked child answering ping-pongs through one shared anonymous mapping.

    Layout: words ``[PING, PONG, SIZE]`` (int64, in their own cache line), then the ping
    and the pong areas of ``max_size`` bytes each. A ping of sequence ``i`` is the data in
    the ping area followed by ``PING = i`` (stored last); the child copies it out, copies
    it into the pong area and stores ``PONG = i``. ``SIZE = -1`` with a new ping stops the
    child. Every spin checks a clock now and then, so a dead partner is an error, not a
    hang.

    Args:
        max_size: the largest message in bytes.
    """

    PING, PONG, SIZE = 0, 1, 2
    _HDR = 64
    TIMEOUT_S = 30.0

    def __init__(self, max_size: int):
        self.max_size = max(1, max_size)
        self.map = mmap.mmap(-1, self._HDR + 2 * self.max_size)  # shared across the fork
        self.words = memoryview(self.map)[:24].cast("q")
        self.seq = 0
        self.child = mp.get_context("fork").Process(target=self._serve, daemon=True)
        self.child.start()

    def _area(self, which: int) -> np.ndarray:
        at = self._HDR + which * self.max_size
        return np.frombuffer(self.map, np.uint8, self.max_size, at)

    @classmethod
    def _spin(cls, words, index: int, want: int) -> None:
        spins, deadline = 0, time.monotonic() + cls.TIMEOUT_S
        while words[index] != want:
            spins += 1
            if not spins & 0xFFFF and time.monotonic() > deadline:
                raise TimeoutError(f"no shared-memory answer within {cls.TIMEOUT_S} s")

    def _serve(self) -> None:
        words, ping, pong = self.words, self._area(0), self._area(1)
        mine = np.empty(self.max_size, np.uint8)
        seq = 0
        while True:
            seq += 1
            self._spin(words, self.PING, seq)
            size = words[self.SIZE]
            if size < 0:
                os._exit(0)
            mine[:size] = ping[:size]
            pong[:size] = mine[:size]
            words[self.PONG] = seq

    def run(self, size: int, count: int) -> float:
        """Drive ``count`` ping-pongs of ``size`` bytes; return seconds."""
        words, ping, pong = self.words, self._area(0), self._area(1)
        mine = np.full(self.max_size, 1, np.uint8)
        words[self.SIZE] = size
        src, dst, out, back = mine[:size], ping[:size], pong[:size], mine[:size]
        seq = self.seq
        spin, PING, PONG = self._spin, self.PING, self.PONG
        t0 = time.perf_counter()
        for _ in range(count):
            seq += 1
            dst[...] = src
            words[PING] = seq
            spin(words, PONG, seq)
            back[...] = out
        dt = time.perf_counter() - t0
        self.seq = seq
        return dt

    def close(self) -> None:
        """Stop the child."""
        self.words[self.SIZE] = -1
        self.seq += 1
        self.words[self.PING] = self.seq
        self.child.join(timeout=10)


def local_rate(fn, size: int, iters: int, warmup: int) -> float:
    """Time ``fn()`` over ``iters`` calls after ``warmup``; return bytes per second."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return size * iters / (time.perf_counter() - t0)


def capped(iters: int, warm_s: float, warmup: int, max_time: float | None) -> int:
    """Cut ``iters`` so the timed loop takes about ``max_time`` seconds (when set)."""
    if max_time is None or warmup == 0 or warm_s <= 0:
        return iters
    return int(min(iters, max(1, max_time * warmup / warm_s)))


def main(argv: list[str] | None = None) -> int:
    """Measure every size and print one row per size."""
    parser = make_parser(__doc__.splitlines()[0], iters=10000, warmup=1000, iters_large=1000,
                         warmup_large=100)
    parser.set_defaults(max_time=3.0)
    args = parser.parse_args(argv)
    if args.mpi4py:
        parser.error("reference.py uses no communication library; drop --mpi4py")
    sizes = [s for s in sizes_from_args(args, 8, 16 << 20) if s > 0]
    max_size = max(sizes)

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    child = mp.get_context("fork").Process(target=_peer, args=(port, max_size), daemon=True)
    child.start()
    sock, _ = listener.accept()
    listener.close()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = memoryview(bytearray(max_size))

    report = Report("Reference: memcpy, numpy add, loopback TCP", "python sockets, numpy "
                    + np.__version__,
                    [("size", "Size", 10, "d"), ("memcpy_gbps", "memcpy(GB/s)", 14, ".2f"),
                     ("add_gbps", "add(GB/s)", 12, ".2f"),
                     ("tcp_latency_us", "TCP lat(us)", 14, ".2f"),
                     ("tcp_stream_mbps", "TCP stream(MB/s)", 18, ".1f"),
                     ("shm_latency_us", "shm lat(us)", 14, ".2f")])
    report.header(f"{WINDOW}-message windows for the stream; one process for memcpy/add")
    src = np.full(max_size, 7, dtype=np.uint8)
    dst = np.empty_like(src)
    fa, fb = np.ones(max_size // 4 + 1, np.float32), np.ones(max_size // 4 + 1, np.float32)
    fc = np.empty_like(fa)
    try:
        for size in sizes:
            iters, warmup = loop_counts(args, size)
            s, d = src[:size], dst[:size]
            memcpy = local_rate(lambda: np.copyto(d, s), size, iters, warmup) / 1e9  # noqa: B023
            n = size // 4
            a, b, c = fa[:n], fb[:n], fc[:n]
            add = (local_rate(lambda: np.add(a, b, out=c), n * 4, iters, warmup) / 1e9  # noqa: B023
                   if n else None)
            warm = tcp_run(sock, PING_PONG, size, warmup, buf)
            pp_iters = capped(iters, warm, warmup, args.max_time)
            latency = tcp_run(sock, PING_PONG, size, pp_iters, buf) * 1e6 / (2 * pp_iters)
            windows, warm_windows = (100, 10) if size <= LARGE_MESSAGE_SIZE else (20, 2)
            warm = tcp_run(sock, STREAM, size, warm_windows, buf)
            windows = capped(windows, warm, warm_windows, args.max_time)
            stream = size * WINDOW * windows / tcp_run(sock, STREAM, size, windows, buf) / 1e6
            # a child of its own per size: a spinning partner would take a core from the
            # other columns' measurements
            shm = ShmPingPong(size)
            try:
                warm = shm.run(size, warmup)
                pp_iters = capped(iters, warm, warmup, args.max_time)
                shm_latency = shm.run(size, pp_iters) * 1e6 / (2 * pp_iters)
            finally:
                shm.close()
            report.row(size, memcpy, add, latency, stream, shm_latency)
    finally:
        sock.sendall(_CMD.pack(QUIT, 0, 0))
        sock.close()
        child.join(timeout=10)
    report.meta = run_metadata(None, "reference", algorithm="-", dtype="uint8")
    report.write(args.json, args.csv, window=WINDOW)
    return 0


if __name__ == "__main__":
    sys.exit(main())
