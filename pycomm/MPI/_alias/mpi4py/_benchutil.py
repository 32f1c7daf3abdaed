"""The option and statistics helpers of :mod:`mpi4py.bench` (pycomm's alias package):
usage errors printed on every rank before any leaves, the per-size sample counts of
``pingpong`` and ``futures``, and the time columns they print."""

import sys as _sys

_SIZES = [1 << k for k in range(33)]        # the message sizes pingpong/futures may use


def _parse(parser, args, comm):
    """``parser.parse_args(args)``; when it exits (a usage error, ``-h``), every rank
    has printed its message before any leaves: a launcher stops the other ranks as soon
    as one exits with an error, and mpiexec shows every rank's message."""
    try:
        return parser.parse_args(args)
    except SystemExit:
        comm.Barrier()
        raise


def _fail_once(parser, comm, message):
    """Exit with status 2 on every rank, rank 0 first printing argparse's usage and
    ``message`` (the others wait for it, as in :func:`_parse`)."""
    try:
        if comm.Get_rank() == 0:
            parser.error(message)
    finally:
        comm.Barrier()
    parser.exit(2)


def _add_quiet(parser, verbose):
    parser.add_argument("-q", "--quiet", dest="verbose", action="store_false",
                        default=verbose, help="print nothing")


def _add_int(parser, flags, dest, default, text=None):
    parser.add_argument(*flags, dest=dest, type=int, default=default, help=text)


def _add_size_schedule(parser, loop, large, huge):
    """The options that cut the samples down for large and huge sizes, and the
    header/statistics switches (``pingpong`` and ``futures`` share them)."""
    for tier, (skip_n, loop_n, size) in (("large", large), ("huge", huge)):
        _add_int(parser, [f"--skip-{tier}"], f"skip_{tier}", skip_n,
                 f"warm-up rounds above --{tier}-size bytes (at most)")
        _add_int(parser, [f"--loop-{tier}"], f"loop_{tier}", loop_n,
                 f"timed {loop} above --{tier}-size bytes (at most)")
        _add_int(parser, [f"--{tier}-size"], f"{tier}_size", size,
                 f"bytes from which the {tier}-message counts apply")
    parser.add_argument("--no-header", dest="print_header", action="store_false",
                        default=True, help="leave out the header lines")
    parser.add_argument("--no-stats", dest="print_stats", action="store_false",
                        default=True, help="leave out the time columns")


def _schedule(options):
    """``(nbytes, skip, loop)`` for each size from ``min_size`` to ``max_size``: the
    large and huge limits only ever lower the counts, and a lowered count stays low."""
    skip, loop = options.skip, options.loop
    for nbytes in _SIZES:
        if not options.min_size <= nbytes <= options.max_size:
            continue
        if nbytes > options.large_size:
            skip, loop = min(skip, options.skip_large), min(loop, options.loop_large)
        if nbytes > options.huge_size:
            skip, loop = min(skip, options.skip_huge), min(loop, options.loop_huge)
        yield nbytes, skip, loop


def _stats(samples):
    import statistics

    mean = statistics.mean(samples) if samples else float("nan")
    stdev = statistics.stdev(samples) if len(samples) > 1 else 0.0
    return mean, stdev


def _stats_columns(mean, stdev, count):
    return f" | {mean:.7e} \u00b1 {stdev:.4e} {count:8d}"


_STATS_HEADER = " | Time Mean [s] \u00b1 StdDev [s]  Samples"


def _say(text):
    _sys.stdout.write(text)
    _sys.stdout.flush()
