"""The rest of mpi4py's names, so that none is a bare ``AttributeError``.

Installed by :mod:`pycomm.MPI` once every class exists:

* persistent collectives (``Allreduce_init``...: each ``Start`` posts the nonblocking
  collective again; the neighbourhood ones are ``Topocomm``'s own,
  :mod:`pycomm.MPI.neighbor`);
* partitioned communication (``Psend_init``, ``Precv_init``, ``Prequest.Pready``...:
  :mod:`pycomm.MPI.partitioned`);
* what pycomm does not offer raises ``NotImplementedError`` naming the feature
  (fault tolerance);
* ``MPI.Comm`` has the collectives of ``MPI.Intracomm``, as mpi4py's base class does
  (a ``Comm`` handle of an intra-communicator, ``Comm.fromhandle(...)``, can call them);
* small aliases and conveniences: ``Topocomm.degrees``, ``Group.Intersect``,
  ``Datatype.Resized``, ``Message.probe``/``iprobe``.
"""

from __future__ import annotations

from pycomm.p2p import ANY_SOURCE, ANY_TAG

from . import partitioned

__all__ = ["install"]

_PERSISTENT = [f"{c}_init" for c in (
    "Allgather", "Allgatherv", "Allreduce", "Alltoall", "Alltoallv", "Alltoallw",
    "Barrier", "Bcast", "Exscan", "Gather", "Gatherv", "Reduce", "Reduce_scatter_block",
    "Reduce_scatter", "Scan", "Scatter", "Scatterv")]
_NOT_OFFERED = {
    "fault tolerance (ULFM)": ["Ack_failed", "Agree", "Iagree", "Get_failed",
                               "Is_revoked", "Revoke", "Shrink", "Ishrink"],
}


def _stub(cls_name: str, name: str, what: str):
    def method(*args, **kwargs):
        raise NotImplementedError(f"{cls_name}.{name}: pycomm does not offer {what}")
    method.__name__ = name
    return method


def _persistent_collective(name: str, prequest: type):
    """``<name>_init``: a persistent request whose every Start posts ``I<name>`` with the
    arguments given here (MPI 4.0 persistent collectives; each Start is collective)."""
    def init(self, *args, info=None, **kwargs):
        post = getattr(self, "I" + name[0].lower() + name[1:])
        self._inner(f"{name}_init")

        def start():
            r = post(*args, **kwargs)
            return r._r, r._finish
        return prequest._persistent(start)
    init.__name__ = f"{name}_init"
    init.__doc__ = f"A persistent {name}: each ``Start()`` runs ``I{name.lower()}`` again."
    return init


def install(ns: dict) -> None:
    """Add the names above to the classes of the ``pycomm.MPI`` namespace ``ns``."""
    comm, intra, topo = ns["Comm"], ns["Intracomm"], ns["Topocomm"]
    for name in _PERSISTENT:
        setattr(intra, name, _persistent_collective(name[:-len("_init")], ns["Prequest"]))
    for name, value in list(vars(intra).items()):     # mpi4py's Comm has them all
        if not name.startswith(("__", "Create_", "Cart_map", "Graph_map")) and \
                name not in vars(comm) and isinstance(value, (staticmethod, type(install))):
            setattr(comm, name, value)                  # with their helpers (_send_recv...)
    for what, names in _NOT_OFFERED.items():
        for name in names:
            for cls in (comm, topo):
                if not hasattr(cls, name):
                    setattr(cls, name, _stub(cls.__name__, name, what))
    ns["Status"].py2f = _stub("Status", "py2f", "Fortran handles")
    ns["Status"].f2py = classmethod(_stub("Status", "f2py", "Fortran handles"))
    partitioned.install(ns)
    topo.degrees = property(lambda self: (self.indegree, self.outdegree))
    ns["Group"].Intersect = ns["Group"].Intersection
    ns["Datatype"].Resized = ns["Datatype"].Create_resized
    message = ns["Message"]
    message.probe = classmethod(lambda cls, comm, source=ANY_SOURCE, tag=ANY_TAG,
                                status=None: comm.mprobe(source, tag, status))
    message.iprobe = classmethod(lambda cls, comm, source=ANY_SOURCE, tag=ANY_TAG,
                                 status=None: comm.improbe(source, tag, status))
