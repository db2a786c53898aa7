"""The constrained Lagrangian baselines: ``method="primal_dual"`` (federated stochastic
gradient descent-ascent) and ``method="augmented_lagrangian"`` (method of multipliers), with
their options (:mod:`.options`) and their algorithm, hooks and status rules
(:mod:`.algorithm`). Equations and references: docs/baselines.md."""

from .algorithm import (AUGMENTED, PRIMAL_DUAL, AugmentedLagrangian, Lagrangian,
                        LagrangianSGDTask, LagrangianState, PrimalDual)
from .options import AugmentedLagrangianOptions, LagrangianOptions, PrimalDualOptions

__all__ = ["AUGMENTED", "PRIMAL_DUAL", "Lagrangian", "PrimalDual", "AugmentedLagrangian",
           "LagrangianSGDTask", "LagrangianState", "LagrangianOptions", "PrimalDualOptions",
           "AugmentedLagrangianOptions"]
