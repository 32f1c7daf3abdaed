"""Choosing a collective's algorithm: the cost model, its measured constants, the choice.

- :mod:`.cost`: every schedule's price and the table of measured constants it is priced
  with (``tuned.json``, or ``PYCOMM_TUNE_FILE``); :mod:`.cost_hosts`: the hierarchical
  and 2-D schedules' price on a communicator spanning hosts, per link.
- :mod:`.tune`: ``python -m pycomm.tuning.tune`` measures the constants;
  ``pycomm/tuning/tune_links.py`` the link between hosts of a multi-host job.
- :mod:`.selection`: a communicator's choice per call, cached, and its debug log; the rule
  is :func:`pycomm.collectives.choose`, which prices the algorithms with :mod:`.cost`.
"""
