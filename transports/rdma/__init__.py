"""RDMA emulation: verbs (libibverbs/pyverbs names) over a software NIC, and a transport.

* :mod:`transports.rdma.verbs`: Context, ProtectionDomain, MemoryRegion, CompletionQueue,
  QueuePair, work requests and completions.
* :mod:`transports.rdma.nic`: the NIC engine thread (links, requester side, CMA copies).
* :mod:`transports.rdma.responder`: the responder side of incoming requests.
* :mod:`transports.rdma.transport`: :class:`RdmaTransport`, the pycomm transport "rdma".
"""

from .verbs import *  # noqa: F401,F403
from .verbs import __all__  # noqa: F401
