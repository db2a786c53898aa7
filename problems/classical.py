"""Classical smooth (constrained) programs written from their published formulas, with known
optima: equalities, degenerate optima, bounds far from 1, large start points.

Each is a deterministic function of w; the library sees it as a SampleFunction over one client
holding one row (the row is ignored), so the full batch is the function itself and the
solver's certificate can be checked against the known solution. None of these is from the
Hock-Schittkowski collection (held out for an independent check of the library).

``CLASSICAL`` maps a name to a :class:`Classical` (build it with :func:`problem`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

import ssca_solver as ss


def smooth(fun: Callable, grad: Callable, name: str) -> ss.SampleFunction:
    """A deterministic smooth function as a SampleFunction over one row."""
    return ss.SampleFunction(lambda w, X, y: np.full(len(X), float(fun(w))),
                             lambda w, X, y: np.asarray(grad(w), dtype=float), name=name)


@dataclass
class Classical:
    """A program min f(w) s.t. g_i(w) <= 0, h_j(w) = 0, lo <= w <= hi with its solution.

    ``constraints``: (fun, grad, kind, name) with kind "<=" (g <= 0) or "==" (h = 0).
    ``optimum``: f at the solution; ``solution``: w* where it is unique (None otherwise);
    ``certifiable``: whether a KKT point exists there (False when no constraint qualification
    holds, so no multiplier balances the gradient: no solver can certify it)."""

    dim: int
    fun: Callable
    grad: Callable
    x0: np.ndarray
    optimum: float
    solution: Optional[np.ndarray] = None
    constraints: list = field(default_factory=list)
    lo: Optional[np.ndarray] = None
    hi: Optional[np.ndarray] = None
    certifiable: bool = True
    source: str = ""


def problem(c: Classical) -> ss.Problem:
    """The :class:`ss.Problem` of a classical program (one client, one row; bounds as a CVXPY
    box domain)."""
    data = ss.FederatedData([(np.zeros((1, 1)), None)])
    cons = []
    for fun, grad, kind, name in c.constraints:
        f = smooth(fun, grad, name)
        cons.append(f == 0.0 if kind == "==" else f <= 0.0)
    domain = None
    if c.lo is not None or c.hi is not None:
        def domain(w, lo=c.lo, hi=c.hi):
            out = []
            if lo is not None:
                out.append(w >= lo)
            if hi is not None:
                out.append(w <= hi)
            return out
    return ss.Problem(smooth(c.fun, c.grad, "f"), cons, dim=c.dim, data=data, domain=domain)


def _rosen(w):
    return 100.0 * (w[1] - w[0] ** 2) ** 2 + (1.0 - w[0]) ** 2


def _rosen_grad(w):
    return np.array([-400.0 * w[0] * (w[1] - w[0] ** 2) - 2.0 * (1.0 - w[0]),
                     200.0 * (w[1] - w[0] ** 2)])


def _circle(r2):
    return (lambda w: w[0] ** 2 + w[1] ** 2 - r2, lambda w: np.array([2 * w[0], 2 * w[1]]))


_i = np.arange(1, 6, dtype=float)

CLASSICAL: dict[str, Classical] = {
    # Rosenbrock (1960), the banana valley; unconstrained minimum (1, 1)
    "rosenbrock": Classical(2, _rosen, _rosen_grad, np.array([-1.2, 1.0]), 0.0,
                            np.array([1.0, 1.0]), source="Rosenbrock 1960"),
    # ... inside the disc |w|^2 <= 2: the minimum (1, 1) sits on the circle with multiplier 0
    # (weakly active: a degenerate optimum)
    "rosenbrock_disc": Classical(2, _rosen, _rosen_grad, np.array([-1.2, 1.0]), 0.0,
                                 np.array([1.0, 1.0]),
                                 [(*_circle(2.0), "<=", "|w|^2 - 2")], source="degenerate"),
    # ... on the unit circle (an equality): w* = (0.78641516, 0.61769831), f* = 0.04567481
    "rosenbrock_circle": Classical(2, _rosen, _rosen_grad, np.array([0.5, 0.5]),
                                   0.045674808, np.array([0.786415, 0.617698]),
                                   [(*_circle(1.0), "==", "|w|^2 - 1")],
                                   source="Rosenbrock on the unit circle"),
    # min w1 + w2 s.t. |w|^2 = 2: w* = (-1, -1), f* = -2, multiplier 1/2 (Nocedal & Wright,
    # Example 12.1)
    "linear_on_circle": Classical(2, lambda w: w[0] + w[1], lambda w: np.ones(2),
                                  np.array([0.5, -1.5]), -2.0, np.array([-1.0, -1.0]),
                                  [(*_circle(2.0), "==", "|w|^2 - 2")],
                                  source="Nocedal & Wright Ex. 12.1"),
    # the Maratos example: min 2 (|w|^2 - 1) - w1 s.t. |w|^2 = 1: w* = (1, 0), f* = -1,
    # multiplier -3/2 (Nocedal & Wright, Example 15.4)
    "maratos": Classical(2, lambda w: 2.0 * (w[0] ** 2 + w[1] ** 2 - 1.0) - w[0],
                         lambda w: np.array([4.0 * w[0] - 1.0, 4.0 * w[1]]),
                         np.array([0.6, 0.8]), -1.0, np.array([1.0, 0.0]),
                         [(*_circle(1.0), "==", "|w|^2 - 1")],
                         source="Nocedal & Wright Ex. 15.4"),
    # min w1^2 + w2^2 s.t. w1 + w2 >= 1: w* = (1/2, 1/2), f* = 1/2
    "halfplane": Classical(2, lambda w: w @ w, lambda w: 2.0 * w, np.array([3.0, -2.0]), 0.5,
                           np.array([0.5, 0.5]),
                           [(lambda w: 1.0 - w[0] - w[1], lambda w: -np.ones(2), "<=",
                             "1 - w1 - w2")], source="textbook"),
    # a flat (degenerate) minimum: min (w - 1)^4 from w = 10, f* = 0
    "quartic": Classical(1, lambda w: (w[0] - 1.0) ** 4,
                         lambda w: np.array([4.0 * (w[0] - 1.0) ** 3]), np.array([10.0]), 0.0,
                         np.array([1.0]), source="degenerate"),
    # no constraint qualification: min w s.t. w^2 <= 0; the solution w* = 0 is no KKT point
    # (grad g = 0 there), so nothing can certify it
    "no_kkt_point": Classical(1, lambda w: w[0], lambda w: np.ones(1), np.array([1.0]), 0.0,
                              np.array([0.0]),
                              [(lambda w: w[0] ** 2, lambda w: 2.0 * w, "<=", "w^2")],
                              certifiable=False, source="failure of LICQ"),
    # bounds far from 1: min sum (w_i - 1000 i)^2 s.t. w_i <= 500 i
    "far_bounds": Classical(5, lambda w: float(np.sum((w - 1000.0 * _i) ** 2)),
                            lambda w: 2.0 * (w - 1000.0 * _i), np.zeros(5),
                            float(np.sum((500.0 * _i) ** 2)), 500.0 * _i,
                            hi=500.0 * _i, source="bounds far from 1"),
    # a large start point: min (w1 - 1)^2 + (w2 - 2)^2 from (5e7, -5e7)
    "far_start": Classical(2, lambda w: (w[0] - 1.0) ** 2 + (w[1] - 2.0) ** 2,
                           lambda w: np.array([2.0 * (w[0] - 1.0), 2.0 * (w[1] - 2.0)]),
                           np.array([5e7, -5e7]), 0.0, np.array([1.0, 2.0]),
                           source="large start"),
    # Beale (1958): w* = (3, 1/2), f* = 0
    "beale": Classical(2, lambda w: ((1.5 - w[0] + w[0] * w[1]) ** 2
                                     + (2.25 - w[0] + w[0] * w[1] ** 2) ** 2
                                     + (2.625 - w[0] + w[0] * w[1] ** 3) ** 2),
                       lambda w: _beale_grad(w), np.array([1.0, 1.0]), 0.0,
                       np.array([3.0, 0.5]), source="Beale 1958"),
    # a box-constrained quadratic whose minimum has some bounds active:
    # min sum i (w_i - 2)^2 s.t. 0 <= w <= (1, 1, 3, 3, 3): w* = (1, 1, 2, 2, 2)
    "box_quadratic": Classical(5, lambda w: float(np.sum(_i * (w - 2.0) ** 2)),
                               lambda w: 2.0 * _i * (w - 2.0), np.zeros(5), 3.0,
                               np.array([1.0, 1.0, 2.0, 2.0, 2.0]), lo=np.zeros(5),
                               hi=np.array([1.0, 1.0, 3.0, 3.0, 3.0]), source="textbook"),
    # two equalities and an inequality: min |w|^2 s.t. w1 + w2 + w3 = 3, w1 - w2 = 0,
    # w3 <= 0.5: w* = (1.25, 1.25, 0.5), f* = 3.375
    "two_equalities": Classical(3, lambda w: w @ w, lambda w: 2.0 * w, np.zeros(3), 3.375,
                                np.array([1.25, 1.25, 0.5]),
                                [(lambda w: w[0] + w[1] + w[2] - 3.0, lambda w: np.ones(3),
                                  "==", "w1 + w2 + w3 - 3"),
                                 (lambda w: w[0] - w[1], lambda w: np.array([1.0, -1.0, 0.0]),
                                  "==", "w1 - w2"),
                                 (lambda w: w[2] - 0.5, lambda w: np.array([0.0, 0.0, 1.0]),
                                  "<=", "w3 - 0.5")], source="textbook"),
    # an equality written as two inequalities (both active at the optimum with opposed
    # gradients, so only the difference of their multipliers is determined):
    # min w1 + w2 s.t. |w|^2 - 2 <= 0 and 2 - |w|^2 <= 0: w* = (-1, -1), f* = -2
    "equality_as_two_inequalities": Classical(
        2, lambda w: w[0] + w[1], lambda w: np.ones(2), np.array([0.5, -1.5]), -2.0,
        np.array([-1.0, -1.0]),
        [(*_circle(2.0), "<=", "|w|^2 - 2"),
         (lambda w: 2.0 - w[0] ** 2 - w[1] ** 2, lambda w: np.array([-2 * w[0], -2 * w[1]]),
          "<=", "2 - |w|^2")], source="Nocedal & Wright Ex. 12.1, split"),
    # a nonconvex objective on a sphere in 3-D: min w1 w2 w3 s.t. |w|^2 = 3:
    # minima at the sign patterns with an odd number of -1 (f* = -1)
    "product_on_sphere": Classical(3, lambda w: w[0] * w[1] * w[2],
                                   lambda w: np.array([w[1] * w[2], w[0] * w[2], w[0] * w[1]]),
                                   np.array([-0.9, 1.1, 0.8]), -1.0, None,
                                   [(lambda w: w @ w - 3.0, lambda w: 2.0 * w, "==",
                                     "|w|^2 - 3")], source="textbook"),
    # zero curvature along the gradient at the start: min sin(w1) + (w2 - 1)^2 s.t.
    # w1 - 2 w2 + 2 = 0 from (0, 1), where F_0's gradient (1, 0) meets sin's inflection and
    # the constraint is linear; on the line f = sin(w1) + w1^2 / 4, whose only stationary
    # point solves cos(w1) + w1 / 2 = 0: w1* = -1.029866529322258, f* = -0.5920740012779437
    "sine_on_line": Classical(2, lambda w: np.sin(w[0]) + (w[1] - 1.0) ** 2,
                              lambda w: np.array([np.cos(w[0]), 2.0 * (w[1] - 1.0)]),
                              np.array([0.0, 1.0]), -0.5920740012779437,
                              np.array([-1.029866529322258, 0.485066735338871]),
                              [(lambda w: w[0] - 2.0 * w[1] + 2.0,
                                lambda w: np.array([1.0, -2.0]), "==", "w1 - 2 w2 + 2")],
                              source="constructed (a start at an inflection)"),
    # gradients spanning 1e12 at the start, from a sixth power: min (w1 - w2)^2 + (w3 - 1)^6
    # + (w4 - 1)^2 / 100 s.t. w1 + w2 + w3 + 4 w4 = 7 from (10, 7, -3, 0.8); f* = 0 at
    # (1, 1, 1, 1), a degenerate minimum (w3 is fixed only to the sixth root of f's accuracy)
    "sixth_power_equality": Classical(
        4, lambda w: (w[0] - w[1]) ** 2 + (w[2] - 1.0) ** 6 + 0.01 * (w[3] - 1.0) ** 2,
        lambda w: np.array([2 * (w[0] - w[1]), -2 * (w[0] - w[1]), 6 * (w[2] - 1.0) ** 5,
                            0.02 * (w[3] - 1.0)]),
        np.array([10.0, 7.0, -3.0, 0.8]), 0.0, None,
        [(lambda w: w[0] + w[1] + w[2] + 4.0 * w[3] - 7.0, lambda w: np.array([1.0, 1, 1, 4]),
          "==", "w1 + w2 + w3 + 4 w4 - 7")], source="constructed (a degenerate optimum)"),
}


def _beale_grad(w):
    x, y = w
    a, b, c = 1.5 - x + x * y, 2.25 - x + x * y ** 2, 2.625 - x + x * y ** 3
    return np.array([2 * a * (y - 1) + 2 * b * (y ** 2 - 1) + 2 * c * (y ** 3 - 1),
                     2 * a * x + 2 * b * 2 * x * y + 2 * c * 3 * x * y ** 2])


