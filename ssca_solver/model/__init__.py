"""The model: what a user writes down (Problem 1 / Problem 3 of the paper).

- :mod:`.problem`: ``Problem`` (objective, constraints, deterministic terms, data) and the
  registry behind ``Problem.solve(method=...)``;
- :mod:`.functions`: ``SampleFunction`` (per-sample values, gradient of the mean),
  ``StochasticConstraint`` (``f <= U``), ``check_grad``;
- :mod:`.vector`: ``VectorSampleFunction`` (K functions from one call, its K components);
- :mod:`.data`: ``FederatedData`` and ``ClientData`` (the rows each client holds);
- :mod:`.deterministic`: the deterministic convex terms and sets (CVXPY), kept exact;
- :mod:`.surrogates`: the surrogate builders (statistics q on the client, a convex model on
  the server; proximal-linear = eqs. (fs0bar)/(fsmbar)).

It imports nothing above it (``tests/test_layers.py``).
"""
