"""Call signatures: what every rank of one collective call must agree on, in two integers.

MPI requires the ranks of a collective call to agree on the collective itself and on some
of its arguments: the root, the reduction op, and the type signature of the data (datatype
and count) wherever the data of one rank meets another's. A program that breaks this is
erroneous, and MPI libraries mostly answer with garbage or a hang. pycomm checks it on
every message instead, at no extra message: each collective message's header carries the
signature of the sender's call, and the receiver compares it with its own (see
:mod:`pycomm.matching` and :mod:`pycomm.aborts`), as the design puts it, "consistency is checked where messages are
matched".

A signature is ``(code, count)``:

* ``code`` packs the collective (5 bits), the op (5 bits), the datatype's kind and item
  size (10 bits) and ``root + 1`` (20 bits, 0 = no root) into one integer below 2**40;
* ``count`` is the element count that must match on every rank (the per-rank block of a
  gather, the whole buffer of an all-reduce), or -1 where counts may differ (the
  v-variants, the object collectives).

:func:`describe` turns a signature back into words for the error message, and
:func:`collective` decorates the communicator's collective methods so that a call that
fails on one rank is abandoned on all (see :mod:`pycomm.comm`).
"""

from __future__ import annotations

import functools
import inspect

import numpy as np

from .errors import ArgumentError

__all__ = ["COLLECTIVES", "collective", "conflict", "signature", "describe", "dtype_code",
           "empty_match"]

# Index = the collective's id in a signature (never reorder: ranks of one job must agree,
# and they run the same code).
COLLECTIVES = ("", "Barrier", "Bcast", "Reduce", "Allreduce", "Gather", "Scatter",
               "Allgather", "Alltoall", "Reduce_scatter_block", "Gatherv", "Scatterv",
               "Allgatherv", "Alltoallv", "Reduce_scatter", "Scan", "Exscan",
               "gather (objects)", "scatter (objects)", "alltoall (objects)",
               "bcast (objects)", "allgather (objects)", "allreduce (objects)")
_IDS = {name: i for i, name in enumerate(COLLECTIVES)}
_OPS = ("", "SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR",
        "MAXLOC", "MINLOC", "REPLACE", "NO_OP")
_OP_IDS = {name: i for i, name in enumerate(_OPS)}
_USER_OP = 31
_KINDS = "?biufcmMOSUV"             # numpy dtype.kind, index 0 = no datatype
_CODES: dict = {}
_SIGS: dict = {}


def dtype_code(dtype: np.dtype | None) -> int:
    """10 bits naming a dtype by kind and item size (byte order and aliases such as 'l'
    and 'q' do not matter: they read the same bytes the same way)."""
    if dtype is None:
        return 0
    code = _CODES.get(dtype)
    if code is None:
        kind = _KINDS.find(dtype.kind)
        code = (max(kind, 0) << 6) | min(dtype.itemsize, 63)
        _CODES[dtype] = code
    return code


def signature(collective: str, dtype: np.dtype | None = None, count: int = -1,
              root: int = -1, op=None) -> tuple[int, int]:
    """The ``(code, count)`` of a call; ``op`` is a :class:`pycomm.ops.Op` or None."""
    key = (collective, dtype, count, root, op)
    sig = _SIGS.get(key)
    if sig is None:                 # calls repeat: compute each signature once
        if len(_SIGS) > 4096:
            _SIGS.clear()
        sig = _SIGS[key] = _signature(collective, dtype, count, root, op)
    return sig


def _signature(collective, dtype, count, root, op) -> tuple[int, int]:
    if op is None:
        op_id = 0
    else:
        op_id = _OP_IDS.get(op.name, _USER_OP)
    return (_IDS[collective] | op_id << 5 | dtype_code(dtype) << 10 | (root + 1) << 20,
            count)


_DTYPE_BITS = 1023 << 10


def empty_match(mine, theirs, nbytes: int) -> bool:
    """Whether two different signatures still name one call: a message of no bytes has
    an empty type signature, which matches any datatype (MPI 4.1, section 3.3.1), so a
    rank that contributes nothing may name another dtype (mpi4py's ``None``/empty
    arrays default to float64 or bytes); collective, op, root and count must agree."""
    return (nbytes == 0 and mine is not None and theirs is not None and mine[1] == theirs[1]
            and not (mine[0] ^ theirs[0]) & ~_DTYPE_BITS)


def conflict(mine, theirs) -> bool:
    """Whether two signatures of one call number name different calls whatever bytes
    move: they differ in collective, op, root or count (a datatype alone may differ where
    no bytes move: :func:`empty_match`)."""
    return mine[1] != theirs[1] or bool((mine[0] ^ theirs[0]) & ~_DTYPE_BITS)


def describe(sig) -> str:
    """``sig`` in words, e.g. ``Allreduce(SUM, float64x1000)`` or ``Bcast(root=0, ...)``."""
    if sig is None:
        return "point-to-point traffic"
    code, count = sig
    name = COLLECTIVES[code & 31] if (code & 31) < len(COLLECTIVES) else f"#{code & 31}"
    op_id, dt, root = code >> 5 & 31, code >> 10 & 1023, (code >> 20) - 1
    args = []
    if root >= 0:
        args.append(f"root={root}")
    if op_id:
        args.append(_OPS[op_id] if op_id < len(_OPS) else "user op")
    if dt:
        kind, size = _KINDS[dt >> 6], dt & 63
        names = {"f": "float", "i": "int", "u": "uint", "c": "complex", "b": "bool"}
        dname = f"{names[kind]}{8 * size}" if kind in names and kind != "b" else \
            ("bool" if kind == "b" else f"{kind}{size}")
        args.append(f"{dname}x{count}" if count >= 0 else dname)
    elif count >= 0:
        args.append(f"{count} elements")
    return f"{name}({', '.join(args)})"


# The bookkeeping every collective call runs around its method (see collective()), as
# source: the wrapper is compiled with the method's own parameters, so that a call hands
# over its arguments as it would to the method itself. A wrapper of (*args, **kwargs)
# packs them into a tuple and a dict and unpacks them again, which on a small call costs
# about as much as the bookkeeping itself.
_WRAPPER = """\
def wrapper(self{params}):
{prologue}    calls = self._calls
    seq = calls.seq
    try:
        out = method(self{forward})
        if self._defer is not None:     # a nonblocking twin: its schedule runs later
            _guard_deferred(self, nonblocking_name)
            return out
        eng = self._engine
        if eng.aborted:             # abandoned by a peer, though nothing here failed
            err = eng.aborted_error(self._cctx, calls.seq)
            if err is not None:
                raise err
        if eng.coll_tags and eng.offload_posted == eng.offload_done:
            calls.check_stale(at_start=False)
    except Exception as exc:
        _failed(self, seq, exc, blocking_name, nonblocking_name)
        raise
    if eng.abort_count != calls.aborts_seen:   # a finished call was abandoned since
        calls.check_late_abort(blocking_name)
    return out
"""

# An argument the caller left out (the wrapper's default for a positional parameter, and
# for a keyword-only one without a default)
_MISSING = object()
# Names the wrapper's code uses itself: a method with a parameter of one of these names
# gets the generic wrapper
_RESERVED = frozenset({"self", "calls", "seq", "out", "exc", "eng", "err", "method",
                       "generic", "blocking_name", "nonblocking_name", "_guard_deferred",
                       "_failed", "_MISSING", "_refused", "_names", "_more", "_unknown"})


def collective(method):
    """Decorate a collective method: a failure abandons the call on every rank.

    The call is counted even when it fails before it was (a bad argument found before
    anything was sent), and every other rank of the communicator learns of it (see the
    module docstring); after a success, messages of finished calls are looked for.

    The wrapper takes the method's parameters. Arguments the method would refuse with a
    TypeError (one too many, an unknown keyword, a missing one) go through a wrapper of
    ``(*args, **kwargs)`` instead, so that the method raises inside the bookkeeping and
    the call is abandoned on every rank, as for any other bad argument.
    """
    blocking_name = method.__name__
    env = {"method": method, "blocking_name": blocking_name,
           "nonblocking_name": "I" + blocking_name[0].lower() + blocking_name[1:],
           "_guard_deferred": _guard_deferred, "_failed": _failed, "_MISSING": _MISSING,
           "__name__": method.__module__}
    generic = _wrapper(env, ", *args, **kwargs", "", ", *args, **kwargs")
    parameters = list(inspect.signature(method).parameters.values())[1:]     # after self
    pos = [p for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    kw = [p for p in parameters if p.kind is p.KEYWORD_ONLY]
    names = [p.name for p in pos + kw]
    if len(names) != len(parameters) or _RESERVED & set(names):
        call = generic      # a method with its own *args or **kwargs, or a name of ours
    else:
        # The positional parameters are positional-only here, _MISSING unless given: a
        # keyword naming one is taken from **_unknown, where a second value for it (one
        # by position, one by keyword) stays, and the call goes to the method through
        # the generic wrapper, which raises the method's own TypeError inside the
        # bookkeeping (as a Python wrapper with these parameters would raise it before).
        required = [p.name for p in pos + kw if p.default is p.empty]
        refused = " or ".join(["_more", "_unknown"] + [f"{n} is _MISSING" for n in required])
        values = "".join(f"{n}, " for n in names)
        keywords = "".join(f"        if {p.name} is _MISSING and '{p.name}' in _unknown:\n"
                           f"            {p.name} = _unknown.pop('{p.name}')\n" for p in pos)
        defaults = "".join(f"    if {p.name} is _MISSING:\n        {p.name} = _D_{p.name}\n"
                           for p in pos if p.default is not p.empty)
        prologue = (f"    if _unknown:\n{keywords}" if keywords else "") + \
            (f"    if {refused}:\n"
             f"        return _refused(generic, self, _names, ({values}), {len(pos)}, "
             f"_more, _unknown)\n{defaults}")
        params = "".join(f", {p.name}=_MISSING" for p in pos) + (", /" if pos else "") + \
            ", *_more" + "".join(f", {p.name}" for p in kw) + ", **_unknown"
        forward = "".join(f", {p.name}" for p in pos) + \
            "".join(f", {p.name}={p.name}" for p in kw)
        call = _wrapper(dict(env, generic=generic, _refused=_refused, _names=names,
                             **{f"_D_{p.name}": p.default for p in pos
                                if p.default is not p.empty}),
                        params, prologue, forward)
        call.__kwdefaults__ = {p.name: _MISSING if p.default is p.empty else p.default
                               for p in kw} or None
    for fn in {call, generic}:
        fn.__name__, fn.__qualname__ = blocking_name, method.__qualname__
        fn.__doc__, fn.__wrapped__ = method.__doc__, method
    return call


def _wrapper(env: dict, params: str, prologue: str, forward: str):
    """The wrapper function made from :data:`_WRAPPER`, its names bound in ``env``."""
    exec(_wrapper_code(params, prologue, forward), env)  # noqa: S102
    return env.pop("wrapper")


@functools.lru_cache(maxsize=None)
def _wrapper_code(params: str, prologue: str, forward: str):
    # compiled once per parameter list: methods of one shape share it (import time)
    return compile(_WRAPPER.format(params=params, prologue=prologue, forward=forward),
                   "<pycomm collective wrapper>", "exec")


def _refused(generic, self, names: list, values: tuple, npos: int, more: tuple,
             unknown: dict):
    """Hand a call the method will refuse to ``generic`` as it was made, as near as
    can be told: ``values`` of the method's parameters ``names`` (``npos`` positional
    ones first; ``_MISSING``: not given), ``more`` positional arguments past them,
    ``unknown`` keywords."""
    if more:            # every positional parameter was filled by position
        # (a keyword-only argument at its default is taken as not given, as the
        # method's message about the positional ones counts those given)
        defaults = generic.__wrapped__.__kwdefaults__ or {}
        given = {n: v for n, v in zip(names[npos:], values[npos:])
                 if v is not _MISSING and v is not defaults.get(n, _MISSING)}
        return generic(self, *values[:npos], *more, **given, **unknown)
    # the positional values up to the first left out go by position: a name also in
    # ``unknown`` was then given twice, and the method says so
    lead = 0
    while lead < npos and values[lead] is not _MISSING:
        lead += 1
    given = {n: v for n, v in zip(names[lead:], values[lead:]) if v is not _MISSING}
    return generic(self, *values[:lead], **given, **unknown)


def _failed(comm, seq: int, exc: Exception, blocking_name: str,
            nonblocking_name: str) -> None:
    """Count and abandon the call that raised ``exc`` (``seq``: the communicator's
    sequence number before it), and name the call in this rank's own argument error."""
    calls = comm._calls
    # Iallreduce runs Allreduce with a deferred schedule: errors say which was called
    name = blocking_name if comm._defer is None else nonblocking_name
    if calls.seq == seq:            # failed before it was counted: count it now
        calls.seq = (seq + 1) & 0x7FFFFFFF
    calls.abandon(name, calls.seq, exc)
    if isinstance(exc, ArgumentError) and name not in str(exc):
        # this rank's own bad argument: say in which call, as the peers' errors do
        exc.args = (f"{exc} (in {name} #{calls.seq} on {comm.name})", *exc.args[1:])


def _guard_deferred(comm, name: str) -> None:
    """Make the schedule just queued by a nonblocking twin abandon its call on failure."""
    defer, seq = comm._defer, comm._calls.seq
    if not defer:
        return
    job = defer[-1]

    def guarded():
        try:
            return job()
        except Exception as exc:
            comm._calls.abandon(name, seq, exc)
            raise
    defer[-1] = guarded
