"""Options of the constrained baselines ``method="primal_dual"`` and
``method="augmented_lagrangian"`` (docs/baselines.md), with their checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...engine import options as opt
from ...errors import ModelError
from ...schedules import PowerStep


def _multipliers(value, M: int, equality=None):
    """lambda_1: M finite numbers, >= 0 except for an equality's (either sign)."""
    if value is None:
        return None
    try:
        lam = np.array(value, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"multipliers0 must be {M} numbers >= 0, got {value!r}") from None
    eq = np.zeros(M, dtype=bool) if equality is None else np.asarray(equality, dtype=bool)
    if lam.size != M or not np.all(np.isfinite(lam)) or np.any((lam < 0) & ~eq[:lam.size]):
        raise ValueError(f"multipliers0 must be {M} finite numbers >= 0 (one per stochastic "
                         f"constraint; an equality's may have either sign), got {value!r}")
    return tuple(float(v) for v in lam)


@dataclass(frozen=True)
class LagrangianOptions(opt.RunOptions):
    """Options shared by the constrained baselines ``method="primal_dual"`` and
    ``method="augmented_lagrangian"`` (and :class:`~ssca_solver.engine.options.RunOptions`); see docs/baselines.md.

    Attributes:
      max_iter: rounds. Default 500.
      batch_size: B rows per local step ("full" for all rows). Default 10.
      local_steps: E local SGD steps per round (E = 1: one stochastic gradient step per round,
        FedSGD-style). Default 1.
      lr: the primal learning rate r_t: a PowerStep(a, alpha) (a / t^alpha), a callable
        t -> value > 0 or a number > 0. Default PowerStep(0.5, 0.3), FedAvg's.
      multipliers0: the starting multipliers lambda_1 (M numbers >= 0). Default zeros.
      feas_tol, kkt_tol: the full-data KKT stopping test, the same as method "ssca"'s (see
        :class:`ssca_solver.methods.ssca.options.SSCAOptions`): the run stops, with status "converged", at the first evaluation
        (every ``eval_every`` rounds) where it passes. Defaults 1e-4.
      solver: CVXPY solver of the server's proximal step on the deterministic terms and domain
        (used unless they are c |w|^2 without a domain) and of the KKT report. Default
        "CLARABEL".
    """

    max_iter: int = 500
    batch_size: Any = 10
    local_steps: int = 1
    lr: Any = field(default_factory=lambda: PowerStep(0.5, 0.3))
    multipliers0: Any = None
    feas_tol: float = 1e-4
    kkt_tol: float = 1e-4
    solver: str = "CLARABEL"

    def checked(self, problem, method: str):
        """The options with the Lagrangian methods' own values checked and normalised (after
        :func:`ssca_solver.engine.options.parse` checked the shared ones)."""
        if not problem.functions:
            raise ModelError(f"method {method!r}: the problem has no SampleFunction: there is "
                             "nothing stochastic to solve; solve it with CVXPY directly")
        if not isinstance(self.solver, str):
            raise ValueError(f"solver must be a CVXPY solver name, got {self.solver!r}")
        values = {"batch_size": opt.batch_size(self.batch_size, problem.data),
                  "local_steps": opt.integer("local_steps", self.local_steps),
                  "lr": opt.learning_rate("lr", self.lr),
                  "multipliers0": _multipliers(self.multipliers0, problem.num_constraints,
                                               problem.equality),
                  "feas_tol": opt.real("feas_tol", self.feas_tol, low=0.0),
                  "kkt_tol": opt.real("kkt_tol", self.kkt_tol, low=0.0),
                  **self._own()}
        return self.__class__(**{**vars(self), **values})


@dataclass(frozen=True)
class PrimalDualOptions(LagrangianOptions):
    """Options of ``Problem.solve(method="primal_dual")`` (federated stochastic gradient
    descent-ascent on the Lagrangian; and :class:`LagrangianOptions`).

    Attributes:
      dual_lr: eta_t of the projected dual ascent lambda <- max(0, lambda + eta_t (Fhat - U)):
        a PowerStep, a callable t -> value > 0 or a number > 0. Default PowerStep(0.5, 0.3).
    """

    dual_lr: Any = field(default_factory=lambda: PowerStep(0.5, 0.3))

    def _own(self) -> dict:
        return {"dual_lr": opt.learning_rate("dual_lr", self.dual_lr)}


@dataclass(frozen=True)
class AugmentedLagrangianOptions(LagrangianOptions):
    """Options of ``Problem.solve(method="augmented_lagrangian")`` (federated stochastic
    augmented Lagrangian; and :class:`LagrangianOptions`).

    Attributes:
      rho: the penalty rho > 0 of L_rho, also the multiplier step
        lambda <- max(0, lambda + rho (Fhat - U)). Default 1.0.
      dual_every: K, rounds of primal steps between multiplier updates (1: every round, the
        linearised augmented Lagrangian method). Default 1.
    """

    rho: float = 1.0
    dual_every: int = 1

    def _own(self) -> dict:
        return {"rho": opt.real("rho", self.rho, low=0.0, low_open=True),
                "dual_every": opt.integer("dual_every", self.dual_every)}
