"""Entry-point for ``python -m mpi4py ...`` (mpi4py's, on pycomm: :mod:`mpi4py.run`)."""

from .run import main

if __name__ == "__main__":
    main()
