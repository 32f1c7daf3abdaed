"""Run a Python program as the N ranks of a pycomm job: ``python launch.py -n 4 script.py``.

See :mod:`pycomm.launch.cli` for the options, and :mod:`pycomm.launch.launcher` for the
environment each rank gets and how the ranks are supervised and cleaned up after.
"""

import sys

from pycomm.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
