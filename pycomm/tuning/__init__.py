"""Choosing a collective's algorithm: the cost model, its measured constants, the per-call choice.

- :mod:`.cost_steps`, :mod:`.cost`: the alpha-beta(-gamma) price of every flat
  algorithm, from its schedule of steps (:mod:`.cost_steps`), and the table of measured
  constants (``tuned.json``, or the file named by ``PYCOMM_TUNE_FILE``) it is priced with
  (:mod:`.cost`).
- :mod:`.cost_hosts`: the price of the two-level and 2-D schedules on a communicator that
  spans hosts.
- :mod:`.tune` and :mod:`.tune_links`: ``python -m pycomm.tuning.tune`` measures the
  constants on this machine; ``pycomm/tuning/tune_links.py``, run by ``launch.py`` on a
  job spanning hosts, measures its intra-host and inter-host link classes.
- :mod:`.selection`: the communicator's choice per call and its cache.

The algorithms themselves live in :mod:`pycomm.collectives`: its
:func:`~pycomm.collectives.choose` prices them with :mod:`.cost`, and :mod:`.selection`
(the communicator's side) calls it. No module here imports an algorithm's module, and no
import cycle runs between the two packages' modules.
"""
