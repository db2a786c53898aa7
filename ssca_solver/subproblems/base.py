"""The contract shared by subproblem solvers.

A solver has ``solve(stats, penalty, round, nu0=None, center=None) -> SubproblemSolution``:
Problem 5 (Problem 2 when M = 0) at the averaged statistics and penalty c; ``nu0`` a warm start
of the multipliers, ``center`` the round's point w_t (the CVXPY path solves in the step
w - w_t about it; the closed forms are exact and ignore it).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np


class SubproblemSolver:
    """The base of the subproblem solvers: their declared capabilities, which the methods read
    instead of probing for them (as CVXPY's solver interfaces declare theirs).

    Attributes:
      name: the solver's name in results ("closed_form", "cvxpy").
      supports_metric: ``with_metric(metric, center)`` gives a solver with the proximal term
        tau (w - w_t)' diag(D_m) (w - w_t) in place of tau |w - w_t|^2.
      supports_model: ``with_model(model, center)`` gives a solver with a quasi-Newton
        model's quadratic term in the objective's surrogate.
      compiles_zero_model: ``with_zero_model(center)`` gives that solver's compiled problem
        with the model's term at zero (one compilation for the rounds before and after the
        first pair).
      parametrize: CVXPY path: compiled once with Parameters (True) or rebuilt each round
        (False); None for solvers without a compilation.
      direct_solves: CVXPY path: the rounds a direct form solved without CVXPY's model; None
        for solvers without one.
    """

    name: str = ""
    supports_metric: bool = False
    supports_model: bool = False
    compiles_zero_model: bool = False
    parametrize: Optional[bool] = None
    direct_solves: Optional[int] = None


class SubproblemSolution:
    """Solution of Problem 5 (Problem 2 when M = 0) at one round.

    Attributes:
      w: the minimiser w-bar^(t), shape (d,).
      slack: s^(t), shape (M,), >= 0.
      multipliers: the duals nu_m of the surrogate constraints Fbar_m(w) - U_m <= s_m, in [0, c].
      value: the subproblem's optimal value (surrogate objective + deterministic terms + c sum s).
      residual: for iterative dual solves, the projected-gradient residual at the stop (0 when
        the solution is exact up to rounding).
      retries: how many fallback settings the solver needed this round (CVXPY path).
      inaccurate: the solver could not certify its answer to full accuracy (CVXPY's
        "optimal_inaccurate", or the closed form's dual iteration stopping above rounding).
      terms: w-bar as a linear combination ((coef, vector), ...) of arrays the solver already
        had (the closed form's w-bar = -(b_0 + sum_m nu_m b_m) / (2 A)); ``((1.0, w),)`` when w
        was given as an array.

    A solver may give ``terms`` instead of ``w``: the server then forms eq. (updatew) straight
    from them in one pass (:func:`ssca_solver._kernels.convex_step`) and ``w`` is only formed,
    once, if somebody reads it. The vectors must not change afterwards (the server's averaged
    statistics never do: every round makes new arrays).
    """

    __slots__ = ("_w", "slack", "multipliers", "value", "residual", "_terms", "retries",
                 "inaccurate")

    def __init__(self, w: Optional[np.ndarray], slack: np.ndarray, multipliers: np.ndarray,
                 value: float, residual: float = 0.0,
                 terms: Optional[Sequence[tuple[float, np.ndarray]]] = None,
                 retries: int = 0, inaccurate: bool = False):
        if (w is None) == (terms is None):
            raise ValueError("SubproblemSolution needs exactly one of w and terms")
        if terms is not None and not terms:
            raise ValueError("SubproblemSolution: terms must not be empty")
        self._w = w
        self._terms = None if terms is None else tuple((float(c), v) for c, v in terms)
        self.slack = slack
        self.multipliers = multipliers
        self.value = value
        self.residual = residual
        self.retries = int(retries)
        self.inaccurate = bool(inaccurate)

    @property
    def w(self) -> np.ndarray:
        if self._w is None:
            from .._kernels import combination

            self._w = combination(self._terms, np.empty(np.shape(self._terms[0][1])))
        return self._w

    @property
    def terms(self) -> tuple:
        return ((1.0, self._w),) if self._terms is None else self._terms

    def __repr__(self):
        return (f"SubproblemSolution(value={self.value!r}, slack={self.slack!r}, "
                f"multipliers={self.multipliers!r}, residual={self.residual!r}, "
                f"retries={self.retries}, inaccurate={self.inaccurate})")


class BoundSolver(SubproblemSolver):
    """A subproblem solver bound to what one round's solve takes besides the statistics (a
    quasi-Newton model, a diagonal metric) and to the point x the round's statistics were
    taken at: the solvers' ``with_model``, ``with_metric`` and ``with_zero_model`` give one.
    Same contract as the solver's own ``solve``; the ``center`` passed to :meth:`solve` is the
    round's point, the one bound here.

    Args:
      base: the solver (its ``name`` is this one's).
      center: x, the point the round's statistics were taken at.
      solve: ``solve(stats, penalty, round, nu0)``, the base's solve with the bound data.
    """

    def __init__(self, base, center: np.ndarray, solve: Callable[..., SubproblemSolution]):
        self.base, self.center, self._solve = base, center, solve
        self.name = base.name

    def solve(self, stats, penalty: float, round: int, nu0=None,
              center=None) -> SubproblemSolution:
        return self._solve(stats, penalty, round, nu0)
