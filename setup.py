"""Packaging hook: the wheel also carries ``pycomm-mpi4py.pth`` at its root.

pip installs a wheel's root files into site-packages, where Python runs a ``.pth`` file
at start-up: with ``PYCOMM_MPI4PY=1`` it makes ``import mpi4py`` resolve to pycomm under
any launcher (see ``pycomm/MPI/hook.py``; editable installs run
``python -m pycomm.MPI.hook install`` instead). Everything else is in pyproject.toml.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "pycomm-mpi4py.pth"
HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithPth(build_py):
    """build_py, plus the .pth file copied to the root of build_lib."""

    def run(self):
        super().run()
        self.copy_file(os.path.join(HERE, "pycomm", "MPI", PTH),
                       os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode=1):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
