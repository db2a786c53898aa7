"""Collection for the README's ``python -m pytest -q`` (``--doctest-modules`` over the
package): without the optional ``flower`` extra (``flwr`` missing, e.g. on Python 3.10) the
Flower transport's package cannot be imported, so it is not collected for doctests instead of
failing the run. The Flower tests in tests/ skip by themselves (``pytest.importorskip``)."""

import importlib.util

collect_ignore = []
if importlib.util.find_spec("flwr") is None:
    collect_ignore.append("ssca_solver/federated/flower")
