"""The engine every method runs on.

- :mod:`.solve`: the one front door (options parsed once -> session -> stages through the
  runner -> final report -> the method's status -> ``Result``) and ``register_method``;
- :mod:`.method`: the method protocol (``Algorithm``, the runner's members) and ``Method``
  (the front door's hooks, with their defaults);
- :mod:`.session`: clients, transport, fresh start or resume, the stages, the final report;
- :mod:`.runner`: the one round loop (evaluations, the KKT stopping test, callbacks,
  checkpoints, progress, divergence);
- :mod:`.options`: ``RunOptions`` (what every method shares) and the value checks;
- :mod:`.checkpoint`: ``.npz`` save and load.

It never imports a method (``tests/test_layers.py``).
"""
