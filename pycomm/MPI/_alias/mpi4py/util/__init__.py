"""``mpi4py.util`` resolved to pycomm: pycomm's own ``dtlib`` (NumPy dtype <-> MPI
datatype), ``pkl5`` (pickle protocol 5 with out-of-band buffers) and ``sync``
(``Sequential``, ``Counter``, ``Mutex``, ``Condition``, ``Semaphore`` on one-sided
windows), with the API of mpi4py 4.1.2's modules of the same names, built on
:mod:`pycomm.MPI`.

``mpi4py.util.pool`` is mpi4py's own, from an installed mpi4py (see :mod:`mpi4py`'s
docstring here); without one it is not provided.
"""

import os as _os

# an installed mpi4py's util directory after this one (pool.py: mpi4py's own code)
__path__ = [*__path__, *(_os.path.join(_p, "util") for _p in
                         getattr(__import__(__name__.rpartition(".")[0]), "__path__", [])[1:])]
