"""Datatype introspection: ``Get_envelope``, ``Get_contents`` and ``decode`` (MPI-4.0
section 5.1.13), from the constructor call that made each derived type.

Every ``Create_*`` method of :class:`~pycomm.MPI.datatypes.Datatype` is wrapped here to
record its name, its old type and its arguments; the envelope and the contents (integers,
addresses, large counts, datatypes) are then laid out as MPI lays them out, and
``decode()`` gives mpi4py's ``(oldtype, "VECTOR", {"count": ..., ...})``, whose keyword
arguments rebuild the type: ``getattr(oldtype, "Create_vector")(**kwargs)``.
"""

from __future__ import annotations

import functools
import inspect

__all__ = ["combiner", "contents", "decode", "envelope", "install", "recreate"]

# method -> (combiner name, how its arguments become (integers, addresses, datatypes))
_RECIPES = {
    "Dup": "DUP", "Create_contiguous": "CONTIGUOUS", "Create_vector": "VECTOR",
    "Create_hvector": "HVECTOR", "Create_indexed": "INDEXED", "Create_hindexed": "HINDEXED",
    "Create_indexed_block": "INDEXED_BLOCK", "Create_hindexed_block": "HINDEXED_BLOCK",
    "Create_struct": "STRUCT", "Create_subarray": "SUBARRAY", "Create_resized": "RESIZED",
}


def _layout(name: str, old, kw: dict) -> tuple[list, list, list]:
    """MPI's (integers, addresses, datatypes) of a constructor call."""
    ints = lambda key: [int(v) for v in kw[key]]
    if name == "DUP":
        return [], [], [old]
    if name == "CONTIGUOUS":
        return [int(kw["count"])], [], [old]
    if name == "VECTOR":
        return [int(kw["count"]), int(kw["blocklength"]), int(kw["stride"])], [], [old]
    if name == "HVECTOR":
        return [int(kw["count"]), int(kw["blocklength"])], [int(kw["stride"])], [old]
    if name == "INDEXED":
        b, d = ints("blocklengths"), ints("displacements")
        return [len(b), *b, *d], [], [old]
    if name == "HINDEXED":
        b = ints("blocklengths")
        return [len(b), *b], ints("displacements"), [old]
    if name == "INDEXED_BLOCK":
        d = ints("displacements")
        return [len(d), int(kw["blocklength"]), *d], [], [old]
    if name == "HINDEXED_BLOCK":
        d = ints("displacements")
        return [len(d), int(kw["blocklength"])], d, [old]
    if name == "STRUCT":
        b = ints("blocklengths")
        return [len(b), *b], ints("displacements"), list(kw["datatypes"])
    if name == "SUBARRAY":
        s = ints("sizes")
        return [len(s), *s, *ints("subsizes"), *ints("starts"), int(kw["order"])], [], [old]
    if name == "RESIZED":
        return [], [int(kw["lb"]), int(kw["extent"])], [old]
    if name == "DARRAY":
        g = ints("gsizes")
        return [int(kw["size"]), int(kw["rank"]), len(g), *g, *ints("distribs"),
                *ints("dargs"), *ints("psizes"), int(kw["order"])], [], [old]
    if name == "F90_INTEGER":
        return [int(kw["r"])], [], []
    if name in ("F90_REAL", "F90_COMPLEX"):
        return [int(kw["p"]), int(kw["r"])], [], []
    raise ValueError(name)


def _recording(method, name: str):
    bind = _binder(method)

    @functools.wraps(method)
    def create(*args, **kwargs):
        out = method(*args, **kwargs)
        kw = bind(*args, **kwargs)
        old = kw.pop("self", None)
        kw.pop("cls", None)
        out._ctor = (name, old, kw)
        return out
    return create


def _binder(method):
    """A function of ``method``'s parameters returning them by name, defaults applied:
    what ``inspect.signature(method).bind(...)`` and ``apply_defaults()`` give for a call
    ``method`` has accepted, without their work per call (which cost as much as making
    the type: mpi4py.util.dtlib makes types at every step)."""
    params = list(inspect.signature(method).parameters.values())
    parts, star = [], False
    for i, p in enumerate(params):
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            star = True
        elif p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        else:
            if p.kind is p.KEYWORD_ONLY and not star:
                parts.append("*")
                star = True
            parts.append(p.name)
            if p.kind is p.POSITIONAL_ONLY and (
                    i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY):
                parts.append("/")
    scope: dict = {}
    exec(f"def bind({', '.join(parts)}):\n    return locals()\n", scope)  # noqa: S102
    bind = scope["bind"]
    # the signature's defaults (that of the function a decorator wraps), the same objects
    kinds, empty = inspect.Parameter, inspect.Parameter.empty
    positional = (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    bind.__defaults__ = tuple(p.default for p in params if p.kind in positional
                              and p.default is not empty) or None
    bind.__kwdefaults__ = {p.name: p.default for p in params if p.kind is kinds.KEYWORD_ONLY
                           and p.default is not empty} or None
    return bind


def install(cls) -> None:
    """Wrap ``cls``'s constructors so that they record how each type was made."""
    for method, name in _RECIPES.items():
        value = cls.__dict__[method]
        if isinstance(value, classmethod):
            setattr(cls, method, classmethod(_recording(value.__func__, name)))
        else:
            setattr(cls, method, _recording(value, name))
    cls.Create_dup = cls.Dup


def record_ctors(cls, functions: dict) -> None:
    """Install functions ``fn(cls, ...)`` (class methods: ``Create_f90_integer``...) and
    ``fn(self, ...)`` (methods of the old type: ``Create_darray``) on ``cls``, recorded;
    their combiner is the name without ``Create_``."""
    for method, fn in functions.items():
        name = method.replace("Create_", "").upper()
        fn.__name__ = fn.__qualname__ = method      # mpi4py's name, which callers read
        first = next(iter(inspect.signature(fn).parameters))
        wrapped = _recording(fn, name)
        setattr(cls, method, classmethod(wrapped) if first == "cls" else wrapped)


def envelope(dt) -> tuple[int, int, int, int, int]:
    """``(n_integers, n_addresses, n_large_counts, n_datatypes, combiner)``."""
    ctor = getattr(dt, "_ctor", None)
    if ctor is None:
        return 0, 0, 0, 0, combiner(dt)
    i, a, d = _layout(*ctor)
    return len(i), len(a), 0, len(d), combiner(dt)


_COMBINERS: dict = {}       # constructor name ("NAMED" for none) -> MPI.COMBINER_*


def combiner(dt) -> int:
    """The ``MPI.COMBINER_*`` constant of the constructor that made ``dt``."""
    ctor = getattr(dt, "_ctor", None)
    name = "NAMED" if ctor is None else ctor[0]
    value = _COMBINERS.get(name)
    if value is None:
        from . import datatypes
        value = _COMBINERS[name] = getattr(datatypes, f"COMBINER_{name}")
    return value


def contents(dt) -> tuple[list, list, list, list]:
    """``(integers, addresses, large_counts, datatypes)`` of a derived type (derived old
    types come back as new handles, which the caller may free)."""
    ctor = getattr(dt, "_ctor", None)
    if ctor is None:
        from pycomm.errors import ArgumentError
        raise ArgumentError(f"Get_contents: {dt.Get_name()} is a named type")
    i, a, d = _layout(*ctor)
    return i, a, [], [t if t.is_predefined else _alive(t).Dup() for t in d]


def _alive(old):
    """``old``, or a usable copy of its handle when the user freed it: MPI keeps a freed
    type alive for the types built on it, so their contents stay readable. The copy is
    kept with the freed type and handed out again while it is not freed itself
    (mpi4py.util.dtlib frees a struct's members once it is made, then decodes it)."""
    if not old._freed:
        return old
    copy = old._cache.get(_REVIVED)
    if copy is None or copy._freed:
        from .datatypes import Datatype
        copy = Datatype(old)
        copy._freed = False
        old._cache[_REVIVED] = copy     # (the copy shares the cache: it finds itself)
    return copy


_REVIVED = "decode: a usable copy of a freed type"


def decode(dt) -> tuple:
    """mpi4py's ``(oldtype, combiner name, keyword arguments)``; ``(dt, "NAMED", {})``."""
    ctor = getattr(dt, "_ctor", None)
    if ctor is None:
        return dt, "NAMED", {}
    name, old, kw = ctor
    kw = dict(kw)
    if old is None and name != "STRUCT":     # the F90 types: made from no old type
        from .datatypes import DATATYPE_NULL
        return DATATYPE_NULL, name, kw
    if name == "STRUCT":               # a classmethod: any of its types rebuilds it
        kw["datatypes"] = [_alive(t) for t in kw["datatypes"]]
        first = kw["datatypes"][0] if kw["datatypes"] else None
        if first is None:
            from .datatypes import DATATYPE_NULL
            first = DATATYPE_NULL
        return first, name, kw
    return _alive(old), name, kw


def recreate(name: str, old, kw: dict, committed: bool):
    """Call the constructor again (how a derived type is unpickled)."""
    from .datatypes import Datatype
    method = "Dup" if name == "DUP" else f"Create_{name.lower()}"
    out = getattr(Datatype, method)(**kw) if name == "STRUCT" or old is None else \
        getattr(old, method)(**kw)
    if committed:
        out.Commit()
    return out
