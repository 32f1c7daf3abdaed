"""``mpi4py.util`` resolved to pycomm: pycomm's own ``dtlib`` (NumPy dtype <-> MPI
datatype), ``pkl5`` (pickle protocol 5 with out-of-band buffers) and ``sync``
(``Sequential``, ``Counter``, ``Mutex``, ``Condition``, ``Semaphore`` on one-sided
windows), with the API of mpi4py 4.1.2's modules of the same names, built on
:mod:`pycomm.MPI`.

``mpi4py.util.pool`` is not provided.
"""
