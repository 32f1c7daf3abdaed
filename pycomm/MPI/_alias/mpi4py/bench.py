"""``python -m mpi4py.bench``: mpi4py's small MPI benchmarks and tests, on pycomm.

pycomm's own implementation of the command line of mpi4py 4.1.2's ``mpi4py.bench`` for
the alias package (``launch.py --mpi4py``; ``from mpi4py import MPI`` is
:mod:`pycomm.MPI`): the same commands, options, exit statuses and output formats::

    python -m mpi4py.bench [--threads | --no-threads] [--thread-level LEVEL] \\
        <command> [args]

``helloworld``
    every rank prints ``Hello, World! I am process R of N on HOST.``, in rank order.
``ringtest``
    rank 0 prints the time a message of ``-n`` bytes takes to go ``-l`` times around the
    ring of ranks (after ``-s`` warm-up rounds).
``pingpong``
    the mean one-way time of a message between ranks 0 and 1 (a rank alone sends to
    itself) and the bandwidth, for each power-of-two size from ``-m`` to ``-n`` bytes:
    buffer sends, or pickle-based object sends with ``-p`` (``--protocol`` picks the
    pickle protocol; ``-o`` sends the pickle's large buffers out of band, as mpi4py's
    ``pkl5`` does, above ``--threshold`` bytes).
``futures``
    the task throughput of an executor mapping an identity function over payloads of
    each power-of-two size. pycomm cannot spawn ``MPIPoolExecutor``'s workers (it has no
    ``MPI_Comm_spawn``): ``-e mpi``, the default, stops with a usage error naming the
    executors that run here (``-e process``, ``-e thread``; ``-e interpreter`` on
    Python 3.14+).

The options' errors (an unknown command, a bad option or value) exit with status 2 and
argparse's message, as mpi4py's do; an unknown command is reported by rank 0 only, the
errors of a command's own options by every rank. All the times printed are measured
here, with ``MPI.Wtime`` (``time.perf_counter`` for ``futures``).
"""

import sys as _sys

from ._benchutil import (_STATS_HEADER, _add_int, _add_quiet, _add_size_schedule,
                         _fail_once, _parse, _say, _schedule, _stats, _stats_columns)

# the benchmark commands by name: helloworld, ringtest, pingpong, futures
COMMANDS = {}


def _command(func):
    COMMANDS[func.__name__] = func
    return func


def _program(command=""):
    """``python -m mpi4py.bench [command]``, with the interpreter's file name."""
    from pathlib import Path

    spec = globals().get("__spec__")
    module = spec.name if spec is not None else "mpi4py.bench"
    return " ".join(part for part in (Path(_sys.executable).name, "-m", module, command)
                    if part)


def _new_parser(command="", usage=None):
    from argparse import ArgumentParser

    parser = ArgumentParser(prog=_program(command), usage=usage)
    parser.color = True             # argparse's colours where Python has them (3.14)
    return parser


# -- helloworld --------------------------------------------------------------------------

@_command
def helloworld(comm, args=None, verbose=True):
    """Each process says hello, in rank order; returns this rank's line."""
    parser = _new_parser("helloworld")
    _add_quiet(parser, verbose)
    options = _parse(parser, args, comm)

    from . import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    width = len(str(size - 1))
    line = (f"Hello, World! I am process {rank:{width}d} of {size} "
            f"on {MPI.Get_processor_name()}.\n")
    token = [bytearray(0), MPI.BYTE]        # an empty message passes the turn on
    comm.Barrier()
    if rank > 0:
        comm.Recv(token, rank - 1, 0)
    if options.verbose:
        _say(line)
    if rank + 1 < size:
        comm.Send(token, rank + 1, 0)
    comm.Barrier()
    return line


# -- ringtest ----------------------------------------------------------------------------

def _ring(comm, nbytes, loop, skip):
    """Seconds for ``loop`` trips of ``nbytes`` around the ring, after ``skip`` untimed
    trips (all of them timed when ``loop`` is 0, as mpi4py times them)."""
    from . import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    outgoing = bytearray(b"\x2a" * nbytes)    # a negative size sends empty messages
    incoming = bytearray(len(outgoing))
    send_spec, recv_spec = [outgoing, MPI.BYTE], [incoming, MPI.BYTE]
    if size > 1 and rank > 0:
        send_spec = recv_spec              # the others pass on what reached them
    start = MPI.Wtime()
    for trip in range(skip + loop):
        if trip == skip:
            start = MPI.Wtime()
        if size == 1:
            comm.Sendrecv(send_spec, right, 0, recv_spec, left, 0)
        elif rank == 0:
            comm.Send(send_spec, right, 0)
            comm.Recv(recv_spec, left, 0)
        else:
            comm.Recv(recv_spec, left, 0)
            comm.Send(send_spec, right, 0)
    elapsed = MPI.Wtime() - start
    if rank == 0 and incoming != outgoing:  # pragma: no cover  (no trips: it differs)
        import traceback
        import warnings

        try:
            warnings.warn("ringtest: the message came back changed", stacklevel=1)
        except UserWarning:                 # warnings turned into errors: stop the job
            traceback.print_exc()
            comm.Abort(2)
    return elapsed


@_command
def ringtest(comm, args=None, verbose=True):
    """Time a message going around the ring of processes; returns the seconds."""
    parser = _new_parser("ringtest")
    _add_quiet(parser, verbose)
    _add_int(parser, ["-n", "--size"], "size", 1, "message size in bytes")
    _add_int(parser, ["-s", "--skip"], "skip", 0, "untimed warm-up trips")
    _add_int(parser, ["-l", "--loop"], "loop", 1, "timed trips")
    options = _parse(parser, args, comm)

    comm.Barrier()
    elapsed = _ring(comm, options.size, options.loop, options.skip)
    if options.verbose and comm.Get_rank() == 0:
        _say(f"time for {options.loop} loops = {elapsed:g} seconds "
             f"({comm.Get_size()} processes, {options.size} bytes)\n")
    return elapsed


# -- pingpong ----------------------------------------------------------------------------

class _PickleChannel:
    """Object sends that pickle here, with ``protocol``, and move the pickle as byte
    messages (each received at its probed size). With ``threshold`` set, the pickle's
    buffers of at least that many bytes travel out of band, one message each after the
    pickle stream, as mpi4py's ``pkl5`` sends them; smaller ones stay in the stream."""

    def __init__(self, comm, mpi, protocol, threshold=None):
        self.comm, self.mpi = comm, mpi
        self.protocol, self.threshold = protocol, threshold

    def _parts(self, obj):
        import pickle

        if self.threshold is None:
            return [pickle.dumps(obj, protocol=self.protocol)]
        apart = []

        def keep_in_band(view):
            raw = view.raw()
            if raw.nbytes < self.threshold:
                return True
            apart.append(raw)
            return False
        stream = pickle.dumps(obj, protocol=self.protocol, buffer_callback=keep_in_band)
        return [stream, *apart]

    def _take(self, source, tag):
        status = self.mpi.Status()
        self.comm.Probe(source, tag, status)
        data = bytearray(status.Get_count(self.mpi.BYTE))
        self.comm.Recv([data, self.mpi.BYTE], status.Get_source(), status.Get_tag())
        return data

    def _load(self, source, tag):
        import itertools
        import pickle

        stream = self._take(source, tag)
        if self.threshold is None:
            return pickle.loads(stream)
        # the out-of-band buffers follow the stream in order; pickle asks for each in turn
        return pickle.loads(stream, buffers=(self._take(source, tag)
                                             for _ in itertools.count()))

    def send(self, obj, dest, tag=0):
        for part in self._parts(obj):
            self.comm.Send([part, self.mpi.BYTE], dest, tag)

    def recv(self, buf=None, source=0, tag=0):
        return self._load(source, tag)

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=0, recvtag=0):
        requests = [self.comm.Isend([part, self.mpi.BYTE], dest, sendtag)
                    for part in self._parts(sendobj)]
        obj = self._load(source, recvtag)
        self.mpi.Request.Waitall(requests)
        return obj


def _allocator(kind):
    """A function giving an uninitialised ``nbytes``-byte buffer of the array kind."""
    if kind == "numpy":
        try:
            import numpy
        except ImportError:                 # pragma: no cover  (pycomm needs numpy)
            return bytearray
        return lambda nbytes: numpy.empty(nbytes, "B")
    if kind == "cupy":                      # pragma: no cover  (no GPU arrays here)
        import cupy
        return lambda nbytes: cupy.empty(nbytes, "B")
    if kind == "numba":                     # pragma: no cover
        import numba.cuda
        return lambda nbytes: numba.cuda.device_array(nbytes, "B")
    return bytearray


@_command
def pingpong(comm, args=None, verbose=True):
    """Time messages between ranks 0 and 1; returns ``[(nbytes, mean, stdev), ...]``."""
    parser = _new_parser("pingpong")
    _add_quiet(parser, verbose)
    _add_int(parser, ["-m", "--min-size"], "min_size", 1, "smallest message in bytes")
    _add_int(parser, ["-n", "--max-size"], "max_size", 1 << 30, "largest message in bytes")
    _add_int(parser, ["-s", "--skip"], "skip", 100, "untimed warm-up round trips")
    _add_int(parser, ["-l", "--loop"], "loop", 10000, "timed round trips")
    parser.add_argument("-a", "--array", dest="array", default="numpy",
                        choices=["numpy", "cupy", "numba", "none"],
                        help="message buffers: NumPy, CuPy or Numba arrays, or bytearray")
    parser.add_argument("-p", "--pickle", dest="pickle", action="store_true",
                        default=False, help="send pickled objects (send/recv)")
    _add_int(parser, ["--protocol"], "protocol", None, "pickle protocol to use")
    parser.add_argument("-o", "--outband", dest="outband", action="store_true",
                        default=False,
                        help="send pickled objects with their buffers out of band")
    _add_int(parser, ["--threshold"], "threshold", None,
             "smallest buffer sent out of band, in bytes")
    _add_size_schedule(parser, "round trips", (10, 1000, 1 << 14), (1, 10, 1 << 20))
    options = _parse(parser, args, comm)

    import pickle

    from . import MPI

    allocate = _allocator(options.array)
    use_objects = options.pickle or options.outband
    protocol = options.protocol if use_objects else None
    if protocol is not None:
        MPI.pickle.PROTOCOL = protocol
    if options.outband:
        threshold = options.threshold
        if threshold is None:
            threshold = MPI.pickle.THRESHOLD
        # as mpi4py's pkl5: its own pickler, the newest protocol (out-of-band needs 5+)
        channel = _PickleChannel(comm, MPI, pickle.HIGHEST_PROTOCOL, threshold)
    elif protocol is not None:              # pycomm's send/recv always use protocol 5
        channel = _PickleChannel(comm, MPI, protocol)
    else:
        channel = comm
    if use_objects:
        send, recv, sendrecv = channel.send, channel.recv, channel.sendrecv
    else:
        send, recv, sendrecv = comm.Send, comm.Recv, comm.Sendrecv
    wtime = MPI.Wtime
    rank, size = comm.Get_rank(), comm.Get_size()

    def one_way(out, into):
        """Half of one round trip's seconds (this rank's view)."""
        start = wtime()
        if size == 1:
            sendrecv(out, 0, 0, into, 0, 0)
            sendrecv(out, 0, 0, into, 0, 0)
        elif rank == 0:
            send(out, 1, 0)
            recv(into, 1, 0)
        elif rank == 1:
            recv(into, 0, 0)
            send(out, 0, 0)
        return (wtime() - start) / 2

    header = options.print_header
    results = []
    for nbytes, skip, loop in _schedule(options):
        if use_objects:
            out, into = allocate(nbytes), None
        else:
            out = [allocate(nbytes), nbytes, MPI.BYTE]
            into = [allocate(nbytes), nbytes, MPI.BYTE]
        comm.Barrier()
        samples = [one_way(out, into) for _ in range(skip + loop)][skip:]
        out = into = None
        mean, stdev = _stats(samples)
        results.append((nbytes, mean, stdev))
        if options.verbose and rank == 0:
            if header:
                header = False
                _say("# MPI PingPong Test\n# Size [B]  Bandwidth [MB/s]"
                     + (_STATS_HEADER if options.print_stats else "") + "\n")
            row = f"{nbytes:10d}{nbytes / mean / 1e6:18.2f}"
            if options.print_stats:
                row += _stats_columns(mean, stdev, loop)
            _say(row + "\n")
    return results


# -- futures -----------------------------------------------------------------------------

def _identity(arg):
    return arg


def _payload_maker(kind):
    if kind == "numpy":
        try:
            import numpy
        except ImportError:                 # pragma: no cover
            return bytes
        return lambda nbytes: numpy.zeros(nbytes, "B")
    if kind == "array":
        import array
        return lambda nbytes: array.array("B", bytes(nbytes))
    return bytes


@_command
def futures(comm, args=None, verbose=True):
    """Measure an executor's task throughput; returns ``[(nbytes, mean, stdev), ...]``."""
    parser = _new_parser("futures")
    _add_quiet(parser, verbose)
    parser.add_argument("-e", "--executor", dest="executor", default="mpi",
                        choices=["mpi", "process", "thread", "interpreter"],
                        help="the executor to measure")
    _add_int(parser, ["-w", "--num-workers"], "workers", None, "number of workers")
    _add_int(parser, ["-t", "--num-tasks"], "tasks", 50, "tasks for each worker")
    _add_int(parser, ["-m", "--min-size"], "min_size", 0, "smallest task payload in bytes")
    _add_int(parser, ["-n", "--max-size"], "max_size", 1 << 20,
             "largest task payload in bytes")
    parser.add_argument("-a", "--allocator", dest="allocator", default="numpy",
                        choices=["numpy", "array", "bytes"], help="task payload type")
    _add_int(parser, ["-c", "--chunksize"], "chunksize", 1,
             "tasks sent to a worker at once")
    parser.add_argument("-b", "--backoff", dest="backoff", type=float, default=0.0,
                        help="the MPI executor's polling backoff")
    parser.add_argument("-o", "--outband", dest="outband", action="store_true",
                        default=False, help="the MPI executor pickles out of band")
    _add_int(parser, ["-s", "--skip"], "skip", 1, "untimed warm-up rounds")
    _add_int(parser, ["-l", "--loop"], "loop", 10, "timed rounds")
    _add_size_schedule(parser, "rounds", (1, 5, 1 << 16), (1, 3, 1 << 18))
    options = _parse(parser, args, comm)

    import concurrent.futures as cf
    import time

    workers = options.workers
    if options.executor == "mpi":
        try:
            from .futures import MPIPoolExecutor, _core
        except ImportError:
            _core = None
        if getattr(_core, "SharedPool", None) is None:     # not under -m mpi4py.futures
            _fail_once(parser, comm, "executor 'mpi': pycomm cannot spawn "
                       "MPIPoolExecutor's workers (MPI_Comm_spawn); use -e process or "
                       "-e thread")
        executor = MPIPoolExecutor(max_workers=workers, backoff=options.backoff,
                                   use_pkl5=options.outband)
    elif options.executor == "process":
        executor = cf.ProcessPoolExecutor(max_workers=workers)
    elif options.executor == "thread":
        executor = cf.ThreadPoolExecutor(max_workers=workers)
    else:
        executor = cf.InterpreterPoolExecutor(max_workers=workers)  # Python 3.14+

    make = _payload_maker(options.allocator)
    nworkers = executor._max_workers        # noqa: SLF001  (what the executor chose)
    ntasks = nworkers * options.tasks

    def run_all(task, items):
        for _ in executor.map(task, items, chunksize=options.chunksize):
            pass

    run_all(time.sleep, [0.001] * nworkers)     # start every worker before timing
    header = options.print_header
    results = []
    for nbytes, skip, loop in _schedule(options):
        items = [make(nbytes) for _ in range(ntasks)]
        samples = []
        for rnd in range(skip + loop):
            start = time.perf_counter()
            run_all(_identity, items)
            if rnd >= skip:
                samples.append(time.perf_counter() - start)
        items = None
        mean, stdev = _stats(samples)
        results.append((nbytes, mean, stdev))
        if options.verbose and comm.Get_rank() == 0:
            if header:
                header = False
                _say(f"# {type(executor).__name__} - {nworkers} workers, "
                     f"{options.tasks} tasks/worker\n# Size [B]  Tasks/s"
                     + (_STATS_HEADER if options.print_stats else "") + "\n")
            row = f"{nbytes:10d}{ntasks / mean:9.0f}"
            if options.print_stats:
                row += _stats_columns(mean, stdev, loop)
            _say(row + "\n")
    executor.shutdown()
    return results


# -- the command line --------------------------------------------------------------------

def main(args=None):
    """``python -m mpi4py.bench [options] <command> [args]``: run one command on every
    rank of ``MPI.COMM_WORLD`` and exit (status 0, or 2 for a usage error)."""
    from argparse import REMAINDER

    parser = _new_parser(usage="%(prog)s [options] <command> [args]")
    parser.add_argument("--threads", dest="threads", action="store_true", default=None,
                        help="set mpi4py.rc.threads: MPI with thread support")
    parser.add_argument("--no-threads", dest="threads", action="store_false",
                        default=None,
                        help="clear mpi4py.rc.threads: MPI without thread support")
    parser.add_argument("--thread-level", dest="thread_level", metavar="LEVEL",
                        default=None,
                        choices=["single", "funneled", "serialized", "multiple"],
                        help="the thread level to ask MPI for (mpi4py.rc.thread_level)")
    parser.add_argument("command", metavar="<command>",
                        help=f"the benchmark to run: {', '.join(COMMANDS)}")
    parser.add_argument("args", metavar="[args]", nargs=REMAINDER,
                        help="the benchmark's own options (<command> -h lists them)")
    options = parser.parse_args(args)          # before MPI starts: no rank waits here

    from . import rc

    if options.threads is not None:
        rc.threads = options.threads
    if options.thread_level is not None:
        rc.thread_level = options.thread_level

    from . import MPI

    world = MPI.COMM_WORLD
    run = COMMANDS.get(options.command)
    if run is None:
        _fail_once(parser, world, f"unknown command {options.command!r}")
    run(world, options.args)
    parser.exit(0)


if __name__ == "__main__":
    main()
