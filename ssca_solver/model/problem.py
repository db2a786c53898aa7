"""``Problem``: a constrained federated problem (Problem 1 / Problem 3 of the paper).

    minimise   F_0(w) + R(w)
    subject to F_m(w) <= U_m,  m = 1..M      (stochastic: averages over the clients' rows)
               w in D                         (deterministic convex set)

F_0 and F_m are :class:`SampleFunction` averages over the federated data; R and D are
deterministic convex CVXPY terms kept exact. ``solve(method=...)`` dispatches through a
registry of methods, like ``scipy.optimize.minimize``.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import cvxpy as cp
import numpy as np

from .data import FederatedData
from .deterministic import DeterministicPart, term_label
from ..errors import ModelError
from .functions import SampleFunction, StochasticConstraint
from .surrogates import builder_of
from .vector import flatten_constraints

_METHODS: dict[str, Callable] = {}


def register_method(name: str, solver: Callable) -> None:
    """Make ``solver(problem, **options)`` available as ``Problem.solve(method=name)``."""
    _METHODS[name] = solver


def _as_list(x) -> list:
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]


def _zero_values(w, X, y):
    return np.zeros(np.shape(X)[0])


def _zero_grad(w, X, y):
    return np.zeros(np.shape(w))


def _zero_hess(w, X, y):
    return np.zeros((np.size(w), np.size(w)))


#: the name of :func:`anchor_objective`'s function in reports
ANCHOR_NAME = "0 (proximal anchor)"


def anchor_objective() -> SampleFunction:
    """F_0 = 0 as a SampleFunction, for a problem whose objective is deterministic without a
    term lambda |w|^2 (lambda > 0): zero, linear, a norm, or none at all (a feasibility
    problem). Its surrogate (eq. (fs0bar) with f_0 = 0) is the proximal term tau |w - w_t|^2,
    so the subproblem's objective is strongly convex as Assumption 2 (asump:fbar) asks and
    tau controls the step's length. Without it an equality's affine surrogate leaves the
    subproblem without a unique solution (a zero objective: any point of the linearisation's
    hyperplane) or unbounded (a linear one), and no tau shortens a rejected step. Its
    statistics cost d + 2 floats per client and round like any function's; its Hessian (for
    ``hessian="auto"``) is the d x d zero matrix."""
    return SampleFunction(_zero_values, _zero_grad, name=ANCHOR_NAME, hess=_zero_hess,
                          convexity="affine")


class Problem:
    """A constrained (or unconstrained) sample-based federated optimisation problem.

    Args:
      objective: a :class:`SampleFunction` (F_0, eq. (Fs0)), or a callable ``w -> convex CVXPY
        expression`` for a deterministic objective kept exact (e.g. the paper's |w|^2 in
        (prob:class-con)). A deterministic objective other than lambda |w|^2 (lambda > 0)
        with stochastic constraints -- zero for a feasibility problem, linear, a norm -- makes
        :attr:`objective` F_0 = 0 (:func:`anchor_objective`), whose surrogate is the proximal
        term tau |w - w_t|^2 that Assumption 2 asks of the objective's.
      constraints: stochastic constraints ``f <= U`` (or ``f >= L``), and equalities ``f == b``,
        built from SampleFunctions; the tuple of K constraints that a
        :class:`~ssca_solver.model.vector.VectorSampleFunction` comparison gives counts as its
        K constraints.
      dim: the size d of the decision variable w.
      data: the :class:`FederatedData` the sample functions average over.
      regularizer: a callable ``w -> convex CVXPY expression`` (or a list of them), added to the
        objective exactly.
      domain: a callable ``w -> CVXPY constraint(s)`` (or a list), a deterministic convex set.
      x0: the start point a solve uses when it is given none (default: zeros), e.g. a
        network's own initialisation: at w = 0 a network's hidden units are dead (its
        gradient vanishes along them for every penalty c).
    """

    def __init__(self, objective, constraints: Sequence[StochasticConstraint] = (),
                 dim: Optional[int] = None, data: Optional[FederatedData] = None,
                 regularizer=None, domain=None, x0=None):
        if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool) or dim < 1:
            raise ModelError(f"dim must be a positive integer (the size of w), got {dim!r}")
        self.dim = int(dim)
        self.x0 = None
        if x0 is not None:
            x0 = np.array(x0, dtype=float)
            if x0.shape != (self.dim,) or not np.all(np.isfinite(x0)):
                raise ModelError(f"x0 must be a finite array of shape ({self.dim},), got "
                                 f"shape {x0.shape}")
            self.x0 = x0
        constraints = flatten_constraints(_as_list(constraints))
        for i, c in enumerate(constraints):
            if isinstance(c, cp.constraints.constraint.Constraint):
                raise ModelError(f"constraint #{i} is a CVXPY constraint; deterministic "
                                 "constraints go in domain=lambda w: [...]")
            if not isinstance(c, StochasticConstraint):
                raise ModelError(f"constraint #{i} must be a stochastic constraint such as "
                                 f"`f <= 0.1` with f a SampleFunction, got {type(c).__name__}")
        self.constraints = tuple(constraints)
        terms = []
        if isinstance(objective, SampleFunction):
            self.objective = objective
        elif callable(objective):
            self.objective = None
            terms.append(("objective", objective))
        else:
            raise ModelError("objective must be a SampleFunction or a callable w -> convex CVXPY "
                             f"expression, got {type(objective).__name__}")
        regs = _as_list(regularizer)
        for i, r in enumerate(regs):
            if not callable(r):
                raise ModelError(f"regularizer #{i} must be a callable w -> CVXPY expression")
            terms.append((term_label("regularizer", i, r), r))
        doms = _as_list(domain)
        for i, dfn in enumerate(doms):
            if not callable(dfn):
                raise ModelError(f"domain #{i} must be a callable w -> CVXPY constraint(s)")
        self.deterministic = DeterministicPart(terms, doms, self.dim)
        #: whether the objective is F_0 = 0 put in by the library (:func:`anchor_objective`)
        self.anchored = False
        if (self.objective is None and self.constraints
                and not self.deterministic.ridge_coefficient()):
            # a deterministic objective other than lambda |w|^2 (lambda > 0): F_0 = 0, whose
            # surrogate is the proximal term tau |w - w_t|^2 that Assumption 2 asks of the
            # objective's (anchor_objective)
            self.objective = anchor_objective()
            self.anchored = True
        if self.functions and not isinstance(data, FederatedData):
            raise ModelError("a problem with SampleFunctions needs data=FederatedData(...), got "
                             f"{type(data).__name__}")
        self.data = data
        self.builders  # checks every function's surrogate now, not at the first solve

    @property
    def builders(self) -> tuple:
        """The surrogate builder of each stochastic function (objective first), read from the
        functions now: a surrogate set on a function after the problem was built is used by the
        next solve."""
        eq = (False,) * (self.objective is not None) + tuple(self.equality)
        return tuple(builder_of(f, e) for f, e in zip(self.functions, eq))

    @property
    def functions(self) -> tuple[SampleFunction, ...]:
        """The stochastic functions, objective first when it is stochastic."""
        head = (self.objective,) if self.objective is not None else ()
        return head + tuple(c.function for c in self.constraints)

    @property
    def first_constraint(self) -> int:
        """The index of the first stochastic constraint in :attr:`functions` (1 when the
        objective is stochastic, else 0)."""
        return 1 if self.objective is not None else 0

    @property
    def bounds(self) -> np.ndarray:
        return np.array([c.bound for c in self.constraints], dtype=float)

    @property
    def equality(self) -> np.ndarray:
        """Which stochastic constraints are equalities ``f == b`` (M booleans)."""
        return np.array([c.equality for c in self.constraints], dtype=bool)

    @property
    def num_constraints(self) -> int:
        return len(self.constraints)

    @property
    def convex(self) -> bool:
        """Problem 3 is convex by its functions' declarations (``SampleFunction(convexity=)``):
        the objective convex or affine (or deterministic only), every inequality's function
        convex or affine, every equality's affine. The deterministic terms and the domain are
        convex by construction (CVXPY's DCP rules)."""
        if self.objective is not None and self.objective.convexity not in ("convex", "affine"):
            return False
        return self.constraints_convex

    @property
    def constraints_convex(self) -> bool:
        """The feasible set of Problem 3 is convex by the functions' declarations: every
        inequality's function convex or affine, every equality's affine (the domain is convex
        by construction). Then a minimiser of the constraints' violation that violates them
        shows that no point meets them (status "infeasible")."""
        return all(c.function.convexity == "affine" if c.equality
                   else c.function.convexity in ("convex", "affine") for c in self.constraints)

    def solve(self, method: str = "ssca", **options):
        """Solve with ``method`` (default "ssca": Algorithm 1, or Algorithm 2 with the penalty
        continuation when there are stochastic constraints). See
        :class:`ssca_solver.SSCAOptions` for the options; unknown options raise TypeError.
        """
        if method not in _METHODS:
            raise ValueError(f"unknown method {method!r}; available: {sorted(_METHODS)}")
        return _METHODS[method](self, **options)

    def __repr__(self) -> str:
        return (f"Problem(dim={self.dim}, objective="
                f"{self.objective.name if self.objective else 'deterministic'}, "
                f"constraints={[c.name for c in self.constraints]}, data={self.data!r})")
