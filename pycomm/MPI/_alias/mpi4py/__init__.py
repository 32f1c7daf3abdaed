"""``mpi4py`` resolved to pycomm: the alias package that ``launch.py --mpi4py`` puts first
on the ranks' ``PYTHONPATH`` (and ``python -m pycomm.MPI.alias`` on ``sys.path``).

``import mpi4py``, ``from mpi4py import MPI``, ``import mpi4py.MPI`` and ``mpi4py.rc`` then
give :mod:`pycomm.MPI`. A real mpi4py installed in the environment is not shadowed unless
``PYCOMM_MPI4PY=1`` asks for it: without that variable this package loads the real one in
its place when there is one.

When it is asked for and a real mpi4py is installed too (``pip install mpi4py``: a wheel,
no MPI needed until its own ``mpi4py.MPI`` is imported), the submodules this package does
not have come from that installation, on pycomm's ``MPI``: ``mpi4py.futures``
(``MPIPoolExecutor``, whose workers are spawned (:mod:`pycomm.MPI.spawn`) or, under
``python -m mpi4py.futures``, the world's other ranks; ``MPICommExecutor``) and
``mpi4py.util.pool``. They are mpi4py's pure-Python code, searched after this package's
own modules (``__path__``).
"""

import importlib.machinery as _machinery
import os as _os
import sys as _sys

_ALIAS_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))


def _real_mpi4py():
    """The spec of an mpi4py found elsewhere on sys.path, or None."""
    path = [p for p in _sys.path
            if _os.path.abspath(p or _os.curdir) != _ALIAS_ROOT]
    return _machinery.PathFinder.find_spec("mpi4py", path)


# read directly, not through pycomm.config: the real mpi4py must load without pycomm
_ASKED = _os.environ.get("PYCOMM_MPI4PY", "").strip().lower() not in ("", "0", "false", "no",
                                                                       "off")
_spec = None if _ASKED else _real_mpi4py()
if _spec is not None:                           # not asked for: the real mpi4py wins
    import importlib.util as _util
    _real = _util.module_from_spec(_spec)
    _sys.modules[__name__] = _real
    _spec.loader.exec_module(_real)
else:
    # the real installation's directory after this one: its pure-Python submodules
    # (futures, util.pool) load on pycomm's MPI; this package's own modules come first
    _installed = _real_mpi4py()
    if _installed is not None and _installed.submodule_search_locations:
        __path__ = [*__path__, *_installed.submodule_search_locations]

    __version__ = "4.0.0+pycomm"
    __author__ = "pycomm (mpi4py-compatible façade)"

    class Rc:
        """``mpi4py.rc``: run-time options read when ``mpi4py.MPI`` is imported.

        Read with the ``MPI4PY_RC_*`` environment as mpi4py reads them, and what pycomm
        does with each: :mod:`pycomm.MPI.rcopts`.
        """

        initialize = True
        threads = True
        thread_level = "multiple"
        finalize = None
        fast_reduce = True
        recv_mprobe = True
        irecv_bufsz = 32768
        errors = "exception"

        def __init__(self, **kwargs):
            self(**kwargs)

        def __setattr__(self, name, value):
            if not hasattr(self, name):
                raise TypeError(f"object has no attribute {name!r}")
            super().__setattr__(name, value)

        def __call__(self, **kwargs):
            for key in kwargs:
                if not hasattr(self, key):
                    raise TypeError(f"unexpected argument {key!r}")
            for key, value in kwargs.items():
                setattr(self, key, value)

        def __repr__(self):
            return f"<mpi4py.rc (pycomm) initialize={self.initialize}>"

    rc = Rc()
    _sys.modules[__name__ + ".rc"] = rc         # as mpi4py: a program may delete both

    def get_include():
        """mpi4py's C headers: pycomm has none."""
        raise NotImplementedError("mpi4py.get_include: pycomm is pure Python and has no "
                                  "C headers")

    def get_config():
        """mpi4py's build configuration: pycomm has no MPI compiler wrappers."""
        return {}

    def profile(name="pycomm", **kwargs):
        """MPI profiling libraries cannot be loaded into pycomm."""
        raise NotImplementedError("mpi4py.profile: pycomm has no PMPI profiling layer")
