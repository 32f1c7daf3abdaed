"""Starting a job: the launcher, the node agents, the rendezvous store and the world's bootstrap.

The top layer of shared/DESIGN.md's picture, with the bootstrap that every rank runs:

- :mod:`.cli` and :mod:`.launcher`: ``python launch.py -n N script.py`` starts N ranks on
  this host, hosts their store, supervises them and cleans up after them;
  :mod:`.nodes` is the per-node agent of a multi-node job (torchrun's model) and
  :mod:`.forward` copies the ranks' output to the launcher's.
- :mod:`.spawning` and :mod:`.worker`: ``pycomm.spawn(fn, n)`` and the persistent
  :class:`~pycomm.launch.spawning.Pool`, each rank a fresh process running ``fn``.
- :mod:`.store`: the authenticated key-value rendezvous server (pyzmq) and its client.
- :mod:`.bootstrap`: the world communicator from the environment (this launcher's
  variables, srun's, mpiexec's, torchrun's), with :mod:`.pmi` for MPICH's Hydra.

Nothing below this package imports it, except :func:`pycomm.init`, which calls the
bootstrap, and ``pycomm.spawn``/``pycomm.Pool``, re-exported from :mod:`.spawning`.
"""
