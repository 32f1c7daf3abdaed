"""Plain-socket reference for ``hier_bench.py --raw``: what the emulated link carries.

``python _raw_tcp.py serve ADDR FLOWS MIB REPS`` on one host and ``... dial ADDR FLOWS MIB
REPS`` on another: ``FLOWS`` TCP connections each carry ``MIB / FLOWS`` MiB in both
directions at once (as the all-reduce's link traffic does); the dialer prints one line
``RAW ms`` per repetition. No pycomm, kernel-default socket buffers.
"""

from __future__ import annotations

import socket
import sys
import threading
import time

PORT = 5555


def _pump(sock: socket.socket, nbytes: int) -> None:
    """Send ``nbytes`` and receive ``nbytes`` on ``sock`` at once."""
    out = threading.Thread(target=sock.sendall, args=(bytes(nbytes),))
    out.start()
    view, got = memoryview(bytearray(1 << 20)), 0
    while got < nbytes:
        n = sock.recv_into(view)
        if not n:
            raise ConnectionError("peer closed early")
        got += n
    out.join()


def _round(socks: list[socket.socket], nbytes: int) -> None:
    threads = [threading.Thread(target=_pump, args=(s, nbytes)) for s in socks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main(argv: list[str]) -> int:
    role, addr, flows, mib, reps = argv[0], argv[1], int(argv[2]), float(argv[3]), int(argv[4])
    nbytes = int(mib * 2**20) // flows
    if role == "serve":
        with socket.create_server((addr, PORT)) as lis:
            for _ in range(reps):
                socks = [lis.accept()[0] for _ in range(flows)]
                _round(socks, nbytes)
                for s in socks:
                    s.close()
        return 0
    for _ in range(reps):
        for attempt in range(50):           # the server may not listen yet
            try:
                socks = [socket.create_connection((addr, PORT)) for _ in range(flows)]
                break
            except ConnectionRefusedError:
                time.sleep(0.1)
        t0 = time.perf_counter()
        _round(socks, nbytes)
        print(f"RAW {1e3 * (time.perf_counter() - t0):.1f}", flush=True)
        for s in socks:
            s.close()
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
