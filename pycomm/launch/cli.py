"""``launch.py``'s command line: ``python launch.py [options] (script.py | -m module) [args]``.

Options are read up to the program (a script, ``-m module``, or after ``--``); the rest is
the program's own argv, which may start with the Python interpreter, as mpiexec's does
(``launch.py -n 4 python -m mpi4py prog.py``). One node: a
:class:`pycomm.launch.launcher.RankGroup` of ``-n`` ranks, supervised until they end; with
``--nnodes``, one node of a multi-node job (:mod:`pycomm.launch.nodes`). ``--mpi4py``
makes ``import mpi4py`` resolve to :mod:`pycomm.MPI` in the ranks and, unless ``--prefix``
is given, passes their output on unprefixed, as ``mpiexec`` does.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys

from pycomm.config import TRANSPORTS as TRANSPORT_CHOICES
from pycomm.launch import forkserver
from pycomm.launch.forward import say
from pycomm.launch.rlimits import out_of_files, raise_open_files_limit

__all__ = ["main"]


_VALUE_OPTIONS = {"-n", "--nprocs", "--transport", "--timeout", "--master-addr", "--master-port",
                  "--stdin"}
# Multi-node options (pycomm.launch.nodes): torchrun's names.
_VALUE_OPTIONS |= {"--nnodes", "--node-rank", "--nproc-per-node", "--placement"}


def _split_argv(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """Split into (launcher options, program argv) at the script or ``-m module``."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return argv[:i], argv[i:]
        if arg == "--":
            return argv[:i], argv[i + 1:] or None
        if not arg.startswith("-"):
            return argv[:i], argv[i:]
        i += 2 if arg in _VALUE_OPTIONS else 1
    return argv, None


def _without_interpreter(parser: argparse.ArgumentParser, program: list[str]) -> list[str]:
    """``program`` without a leading Python interpreter, as ``mpiexec -n N python
    prog.py`` names it: the ranks run launch.py's own interpreter, so one that is another
    (a different version or virtual environment) is an error, never silently swapped."""
    first = program[0]
    if first.startswith("-") or first.endswith(".py") or \
            not re.fullmatch(r"python[\d.]*", os.path.basename(first)):
        return program
    found = shutil.which(first)
    if found is None or not _same_interpreter(found):
        parser.error(f"the ranks run launch.py's interpreter ({sys.executable}), not "
                     f"{first!r}{f' ({found})' if found else ''}: run launch.py with that "
                     f"one instead ({first} launch.py ...)")
    if len(program) < 2:
        parser.error(f"give the program {first} should run: a script or -m module")
    return program[1:]


def _same_interpreter(path: str) -> bool:
    """Whether ``path`` runs this interpreter: the same file, or a wrapper (a pyenv shim, a
    venv's link) that says it is."""
    if os.path.samefile(path, sys.executable):
        return True
    try:
        out = subprocess.run([path, "-c", "import sys; print(sys.executable)"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        return bool(out) and os.path.samefile(out, sys.executable)
    except (OSError, subprocess.SubprocessError):
        return False


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch.py", usage="%(prog)s [options] (script.py | -m module) [args...]",
        description="Run N copies of a Python program as the ranks of one pycomm job.")
    parser.add_argument("-n", "--nprocs", type=int, default=1, help="number of ranks (1)")
    parser.add_argument("--transport", choices=TRANSPORT_CHOICES, default=None,
                        help="PYCOMM_TRANSPORT for the ranks (default: PYCOMM_TRANSPORT "
                             "of this environment, else auto)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="PYCOMM_TIMEOUT for the ranks: bound on every blocking wait")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--prefix", dest="no_prefix", action="store_false", default=None,
                       help="prefix output lines with [rank] (the default, except with "
                            "--mpi4py; mpiexec -l)")
    shown.add_argument("--no-prefix", dest="no_prefix", action="store_true",
                       help="pass the ranks' output on unchanged, as mpiexec does (the "
                            "default with --mpi4py)")
    parser.add_argument("--stdin", default="0", metavar="RANK|none",
                        help="the rank that reads launch.py's stdin (0, as mpiexec); the "
                             "others read /dev/null. With --nnodes: a world rank, which "
                             "reads the stdin of the launch.py of the node that hosts it "
                             "(node 0 hosts rank 0); the other nodes' launch.py do not "
                             "read or hold their stdin")
    parser.add_argument("--master-addr", default="127.0.0.1",
                        help="address the rendezvous store binds (127.0.0.1)")
    parser.add_argument("--master-port", type=int, default=0,
                        help="port of the rendezvous store (0: any free port)")
    nodes = parser.add_argument_group(
        "many hosts", "run once per node, torchrun's way (see pycomm.launch.nodes): the world is "
        "NNODES x NPROC_PER_NODE ranks and node rank 0 hosts the store at --master-addr")
    nodes.add_argument("--nnodes", type=int, default=None, help="number of nodes")
    nodes.add_argument("--node-rank", type=int, default=0, help="this node's rank (0)")
    nodes.add_argument("--nproc-per-node", type=int, default=1,
                       help="ranks on this node (1)")
    nodes.add_argument("--placement", choices=("block", "cyclic"), default="block",
                       help="world ranks of a node: consecutive (block) or one per node in "
                            "turn (cyclic)")
    parser.add_argument("--mpi4py", action="store_true",
                        help="run an unmodified mpi4py program: in the ranks, import mpi4py "
                             "resolves to pycomm.MPI (sets PYCOMM_MPI4PY=1 and puts pycomm's "
                             "alias package first on PYTHONPATH)")
    return parser


def _check_nodes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The shape of a multi-node job (``--nnodes``), checked before anything starts."""
    if args.nnodes < 1:
        parser.error(f"--nnodes must be at least 1, got {args.nnodes}")
    if not 0 <= args.node_rank < args.nnodes:
        parser.error(f"--node-rank must be in 0..{args.nnodes - 1}, got {args.node_rank}")
    if args.nproc_per_node < 1:
        parser.error(f"--nproc-per-node must be at least 1, got {args.nproc_per_node}")


def _stdin_rank(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--stdin`` as a rank of the world: ``-n``, or ``--nnodes`` x ``--nproc-per-node``."""
    world = args.nprocs if args.nnodes is None else args.nnodes * args.nproc_per_node
    try:
        rank = int(args.stdin)
    except ValueError:
        rank = -1
    if not 0 <= rank < world:
        shape = ("" if args.nnodes is None else
                 f" (the world of --nnodes {args.nnodes} x --nproc-per-node "
                 f"{args.nproc_per_node})")
        parser.error(f"--stdin must be a rank in 0..{world - 1} or 'none', got "
                     f"{args.stdin!r}{shape}")
    return rank


def main(argv: list[str] | None = None) -> int:
    """Run the launcher on ``argv`` (default ``sys.argv[1:]``); return its exit code."""
    files = raise_open_files_limit()   # before anything is opened; the ranks inherit it
    parser = _parser()
    options, program = _split_argv(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(options)
    if not program:
        parser.error("give the program to run: a script or -m module")
    program = _without_interpreter(parser, program)
    if program[0] == "-m" and len(program) < 2:
        parser.error("-m needs a module name")
    if args.nprocs < 1:
        parser.error(f"-n must be at least 1, got {args.nprocs}")
    if args.timeout is not None and not args.timeout > 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")
    if args.transport is None:          # the environment's, as the ranks would read it
        args.transport = os.environ.get("PYCOMM_TRANSPORT") or "auto"
        if args.transport not in TRANSPORT_CHOICES:
            parser.error(f"PYCOMM_TRANSPORT must be one of {', '.join(TRANSPORT_CHOICES)}, "
                         f"got {args.transport!r}")
    if args.no_prefix is None:          # mpi4py programs print as under mpiexec
        args.no_prefix = args.mpi4py
    if args.nnodes is not None:
        _check_nodes(parser, args)
    stdin_rank = None if args.stdin == "none" else _stdin_rank(parser, args)

    if args.nnodes is not None:         # one node of a multi-node job
        from pycomm.launch.nodes import run_nodes
        extra = None
        if args.mpi4py:
            from pycomm.launch.mpi4pyenv import environment
            extra = environment()
        return run_nodes(args, program, extra, stdin_rank)

    extra = None
    if args.mpi4py:         # ``import mpi4py`` in the ranks gives pycomm.MPI
        from pycomm.launch.mpi4pyenv import environment
        extra = environment()
    if args.nprocs > 1:     # (start_ranks starts a lone rank afresh)
        # The ranks' fork server imports numpy and pycomm while this process imports the
        # launcher and starts the job's store.
        forkserver.prestart(program, {**os.environ, **(extra or {})})
    from pycomm.launch.launcher import RankGroup
    got_signal: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        if got_signal:  # a second Ctrl-C: stop waiting politely
            group.signal_all(signal.SIGKILL)
        got_signal.append(signum)

    group = RankGroup(args.nprocs, transport=args.transport, timeout=args.timeout,
                      prefix=not args.no_prefix, master_addr=args.master_addr,
                      master_port=args.master_port, stdin_rank=stdin_rank)
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            group.start(program, extra_env=extra)
        except OSError as exc:
            if not out_of_files(exc):
                raise
            say(f"pycomm.launch: out of file descriptors while starting {args.nprocs} "
                f"ranks ({exc.strerror}): this process may have {files} open (ulimit -n; "
                "the launcher holds 2 per rank, a rank one per peer); raise the limit "
                "(ulimit -Hn) or start fewer ranks per launcher")
            return 1
        return group.supervise(lambda: got_signal[0] if got_signal else None)
    finally:
        group.close()
        for sig, handler in old.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
