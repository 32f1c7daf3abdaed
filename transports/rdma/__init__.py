"""RDMA emulation: verbs (libibverbs/pyverbs names) over a software NIC, and a transport.

* :mod:`transports.rdma.ibv`: the ``<infiniband/verbs.h>`` constants, work requests and
  completions, and the address helpers (it imports none of the others).
* :mod:`transports.rdma.verbs`: Context, ProtectionDomain, MemoryRegion, CompletionQueue,
  QueuePair (re-exporting :mod:`~transports.rdma.ibv`'s names).
* :mod:`transports.rdma.nic`: the NIC engine thread (links, requester side, CMA copies).
* :mod:`transports.rdma.responder`: the responder side of incoming requests.
* :mod:`transports.rdma.wire`: the messages between two NICs over one TCP connection.
* :mod:`transports.rdma.transport`: :class:`RdmaTransport`, the pycomm transport "rdma".
"""

from .verbs import *  # noqa: F401,F403
from .verbs import __all__  # noqa: F401
