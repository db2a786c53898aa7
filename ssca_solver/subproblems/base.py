"""The contract shared by subproblem solvers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SubproblemSolution:
    """Solution of Problem 5 (Problem 2 when M = 0) at one round.

    Attributes:
      w: the minimiser w-bar^(t), shape (d,).
      slack: s^(t), shape (M,), >= 0.
      multipliers: the duals nu_m of the surrogate constraints Fbar_m(w) - U_m <= s_m, in [0, c].
      value: the subproblem's optimal value (surrogate objective + deterministic terms + c sum s).
      residual: for iterative dual solves, the projected-gradient residual at the stop (0 when
        the solution is exact up to rounding).
    """

    w: np.ndarray
    slack: np.ndarray
    multipliers: np.ndarray
    value: float
    residual: float = 0.0
