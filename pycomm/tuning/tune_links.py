"""Measure the link between hosts, the cost model's ``net`` entry, on a job spanning hosts.

Run on every rank (rank 0 writes or updates ``FILE``; see
:func:`pycomm.tuning.tune.links_entry`)::

    python launch.py --nnodes 2 --node-rank K --master-addr HOST --nproc-per-node 2 \\
        pycomm/tuning/tune_links.py --out FILE [--quick]
"""

import sys

from pycomm.tuning.tune import links_main

if __name__ == "__main__":
    sys.exit(links_main())
