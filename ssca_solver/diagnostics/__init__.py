"""Diagnostics: what a run reports, for every method.

- :mod:`.evaluation`: full-data evaluations (a client task);
- :mod:`.certificate`: ``KKTReport`` and the certificate's rules (the stopping test that
  decides ``success``, the end-of-run promotion, the shared status of certifying methods);
- :mod:`.kkt`: the KKT report's computation: multipliers, relative residuals, the violation's
  stationarity;
- :mod:`.result`: ``Result``, ``Communication``, ``Stage``;
- :mod:`.history`: ``History`` (per-round arrays) and the ``Recorder`` that fills it.
"""
