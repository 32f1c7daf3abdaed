"""Run several of mpi4py's demo programs in one job (pycomm's, for test_mpi_demos.py).

``python launch.py --mpi4py -n N run_demos.py NAME...`` runs each named demo on every
rank as ``python demo.py ARGS < STDIN`` would (``runpy``, ``__main__``), capturing its
standard output per rank, then rank 0 prints one JSON object: per demo, each rank's
output, its error (None, or the exception / non-zero exit it ended with) and, for
``mandelbrot``, a digest of the image rank 0 put together and of the sequential one.
"""
import contextlib
import hashlib
import io
import json
import os
import runpy
import sys

from mpi4py import MPI

HERE = os.path.dirname(os.path.abspath(__file__))
DEMOS = {       # name: (path, argv, stdin)
    "helloworld": ("helloworld.py", [], ""),
    "sequential": ("sequential/test_seq.py", [], ""),
    "cpi-cco": ("compute-pi/cpi-cco.py", [], "100\n"),
    "cpi-rma": ("compute-pi/cpi-rma.py", [], "100\n"),
    "mandelbrot": ("mandelbrot/mandelbrot.py", [], ""),
    "nxtval-onesided": ("nxtval/nxtval-onesided.py", [], ""),
    "nxtval-scalable": ("nxtval/nxtval-scalable.py", [], ""),
    "nxtval-mpi3": ("nxtval/nxtval-mpi3.py", [], ""),
    "reductions": ("reductions/test_reductions.py", ["-q"], ""),
    "win-semantics": ("win_semantics.py", [], ""),
}


def run(name):
    path, args, stdin = DEMOS[name]
    full = os.path.join(HERE, path)
    saved = sys.argv, sys.stdin, list(sys.path)
    sys.argv, sys.stdin = [full, *args], io.StringIO(stdin)
    sys.path.insert(0, os.path.dirname(full))
    out, err, space = io.StringIO(), None, {}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            space = runpy.run_path(full, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (0, None):
            err = f"SystemExit({exc.code!r})"
    except BaseException as exc:        # noqa: BLE001  (reported, not raised)
        err = f"{type(exc).__name__}: {exc}"
    finally:
        sys.argv, sys.stdin, sys.path[:] = saved[0], saved[1], saved[2]
    got = {"out": out.getvalue(), "err": err}
    if name == "mandelbrot" and MPI.COMM_WORLD.rank == 0 and "M" in space:
        with contextlib.redirect_stdout(io.StringIO()):
            seq = runpy.run_path(os.path.join(HERE, "mandelbrot/mandelbrot-seq.py"))
        got["image"] = hashlib.sha1(space["M"].tobytes()).hexdigest()
        got["sequential"] = hashlib.sha1(seq["M"].tobytes()).hexdigest()
    MPI.COMM_WORLD.Barrier()
    return got


results = {name: run(name) for name in sys.argv[1:]}
everyone = MPI.COMM_WORLD.gather(results, 0)
if MPI.COMM_WORLD.rank == 0:
    print(json.dumps({name: [r[name] for r in everyone] for name in results}))
