"""Diagnostics: what a run reports, for every method.

- :mod:`.evaluation`: full-data evaluations (a client task);
- :mod:`.kkt`: the KKT report with its multipliers
  and relative residuals (the stopping test that decides ``success``), the violation's
  stationarity;
- :mod:`.result`: ``Result``, ``KKTReport``, ``Communication``, ``Stage``;
- :mod:`.history`: ``History`` (per-round arrays) and the ``Recorder`` that fills it.
"""
