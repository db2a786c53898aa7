"""The methods, one package or module each with its options, state, step and status rules:
mini-batch SSCA (Algorithms 1 and 2, :mod:`.ssca`), the SGD baselines (:mod:`.fedavg`) and the
constrained Lagrangian baselines (:mod:`.lagrangian`: primal-dual, augmented Lagrangian).

Each is a :class:`ssca_solver.engine.method.Method` run by the one front door
(:mod:`ssca_solver.engine.solve`). A method imports the shared machinery, never another
method (``tests/test_layers.py``).
"""

from .fedavg import FedAvg, FedAvgOptions, FedAvgState, LocalSGDTask
from .lagrangian import (AugmentedLagrangian, AugmentedLagrangianOptions, Lagrangian,
                         LagrangianSGDTask, LagrangianState, PrimalDual, PrimalDualOptions)
from .ssca import SSCA, SSCAOptions, SSCARoundTask

#: the built-in methods by name (``Problem.solve(method=name)``)
BUILTIN = {m.name: m for m in (SSCA, FedAvg, PrimalDual, AugmentedLagrangian)}

__all__ = ["SSCA", "SSCAOptions", "SSCARoundTask", "FedAvg", "FedAvgOptions", "FedAvgState",
           "LocalSGDTask", "Lagrangian", "PrimalDual", "AugmentedLagrangian",
           "PrimalDualOptions", "AugmentedLagrangianOptions", "LagrangianState",
           "LagrangianSGDTask", "BUILTIN"]
