"""``mpi4py.util`` resolved to pycomm: pycomm's own ``dtlib`` (NumPy dtype <-> MPI
datatype) and ``pkl5`` (pickle protocol 5 with out-of-band buffers), with the API of
mpi4py 4.1.2's modules of the same names, built on :mod:`pycomm.MPI`.

``mpi4py.util.pool`` and ``mpi4py.util.sync`` are not provided.
"""
