"""The shared-memory ring alone: an 8 B ping-pong through ``send_now``/``recv_now``.

What a one-way message costs with nothing of pycomm above the transport (no communicator,
engine, request or flight recorder): the floor under ``osu_latency``'s figure on this
machine (benchmarks/README.md, "Small messages again, and where a point-to-point
message's time goes"). Two ranks of one host; rank 0 prints the best and the median of 5
blocks of 5000 round trips, as half a round trip in µs.

Run::

    python launch.py -n 2 --transport shm --no-prefix benchmarks/ring_pingpong.py
"""

import time

import numpy as np

import pycomm
from pycomm.p2p import _eager_header

comm = pycomm.COMM_WORLD
rank, peer = comm.rank, 1 - comm.rank
ring = comm._engine.route[peer]           # the shm transport to the peer
header = _eager_header(comm._pctx, 1)
out = np.ones(8, np.uint8).data.cast("B")
into = np.zeros(8, np.uint8).data.cast("B")


def receive() -> None:
    while ring.recv_now(peer, header, into) < 0:
        pass


def round_trips(n: int) -> None:
    for _ in range(n):
        if rank == 0:
            ring.send_now(peer, header, out)
            receive()
        else:
            receive()
            ring.send_now(peer, header, out)


round_trips(1000)
blocks = []
for _ in range(5):
    comm.Barrier()
    t0 = time.perf_counter()
    round_trips(5000)
    blocks.append((time.perf_counter() - t0) / 10000 * 1e6)
if rank == 0:
    blocks.sort()
    print(f"ring ping-pong, one-way µs: best {blocks[0]:.2f} median {blocks[2]:.2f}")
