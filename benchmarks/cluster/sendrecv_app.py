"""Point-to-point across hosts: ``Sendrecv`` of 8 MiB each way between two ranks.

Run on two emulated hosts (one rank each), beside plain sockets carrying the same bytes::

    sudo python -m benchmarks.cluster.netns --hosts 2 --rate 2gbit -- python launch.py \
        --nnodes 2 --node-rank {node} --master-addr {master} --nproc-per-node 1 \
        --no-prefix benchmarks/cluster/sendrecv_app.py
    sudo python -m benchmarks.cluster.netns --hosts 2 --rate 2gbit -- bash -c \
        'if [ {node} = 0 ]; then python benchmarks/cluster/_raw_tcp.py serve {addr} 1 8 10;
         else sleep 1; python benchmarks/cluster/_raw_tcp.py dial {master} 1 8 10; fi'

Three warm-up exchanges, then ten timed ones, each after a Barrier; rank 0 prints the
fastest and the median in milliseconds.
"""

import time

import numpy as np

import pycomm

comm = pycomm.COMM_WORLD
rank = comm.rank
peer = 1 - rank
n = 8 << 20
send = np.ones(n, np.uint8)
recv = np.zeros(n, np.uint8)
for _ in range(3):
    comm.Sendrecv(send, peer, 1, recv, peer, 1)
times = []
for _ in range(10):
    comm.Barrier()
    t0 = time.perf_counter()
    comm.Sendrecv(send, peer, 1, recv, peer, 1)
    times.append(time.perf_counter() - t0)
if rank == 0:
    times.sort()
    print(f"pycomm Sendrecv 8 MiB each way ms: min {times[0] * 1e3:.2f} "
          f"median {times[5] * 1e3:.2f}")
