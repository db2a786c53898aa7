"""The Newton model of the full-batch phase: the clients' curvature of every function at the
round's point, assembled into the Hessian of the Lagrangian.

On full batches every client sends, beside its statistics, the sum over its rows of each
function's Hessian at w_t (``SampleFunction.hess``; :mod:`.client`, ``"curv:m"``, packed
upper triangles). Weighted like the statistics (h_i N_i / (B_i N)), they add up to the
full-data Hessians H_m = grad^2 F_m(w_t): a sum of replies, so secure aggregation and partial
participation apply as to every statistic. The server's model of the Lagrangian's Hessian is

    B = H_0 + sum_m nu_m H_m        (nu: the multipliers of the subproblem that gave w_t),

made positive definite: each eigenvalue replaced by its absolute value, and raised to at least
EIGEN_FLOOR of the largest (the Lagrangian of a nonconvex problem need not be convex: a
negative curvature kept by its size, not floored near zero, keeps the step from running far
along it; the modified Newton methods of Nocedal & Wright, sec. 3.4). It enters the
objective's surrogate exactly where the quasi-Newton model does (:mod:`.quasi_newton`: same
interface), so every round is an SQP step (Nocedal & Wright, ch. 18) with the linearised
constraints of Problem 5 and the same exact-penalty backtracking (:mod:`.acceptance`). With
the exact Hessian the steps converge quadratically near a KKT point whatever the conditioning
of the problem, where first-order and quasi-Newton rounds slow down with it.
"""

from __future__ import annotations

import numpy as np

from .client import CURVATURE, unpack_symmetric

#: the model's smallest eigenvalue is at least this fraction of its largest
EIGEN_FLOOR = 1e-12


class NewtonModel:
    """A positive definite model B of the Lagrangian's Hessian from its full-data Hessian
    ``H`` (symmetric, d x d; eigenvalues by their absolute values, floored), with the interface of
    :class:`~ssca_solver.methods.ssca.quasi_newton.LBFGSModel` that the subproblem solvers
    read: ``delta`` (the model's scale: the mean of its eigenvalues), ``directions()`` (its
    eigenvectors, rows), ``matvec``, ``matmat``."""

    def __init__(self, H: np.ndarray):
        H = np.asarray(H, dtype=float)
        h, V = np.linalg.eigh(0.5 * (H + H.T))
        h = np.abs(h)                     # a negative curvature counts by its size
        top = float(np.max(h, initial=0.0))
        h = np.maximum(h, EIGEN_FLOOR * top if top > 0.0 else 1e-300)
        self.S = H                       # the state's array this model was built from
        self.eigenvalues, self.V = h, V
        self.B = (V * h) @ V.T
        self.delta = float(np.mean(h))

    def __len__(self) -> int:
        return self.B.shape[0]

    def matvec(self, v: np.ndarray) -> np.ndarray:
        return self.B @ v

    def eigen(self) -> tuple:
        """(eigenvalues, eigenvectors as columns) of B: the closed-form subproblem's basis."""
        return self.eigenvalues, self.V

    def matmat(self, V: np.ndarray) -> np.ndarray:
        return self.B @ V

    def directions(self) -> np.ndarray:
        return self.V.T


def lagrangian_hessian(curvature: dict, nu: np.ndarray, first: int, d: int) -> np.ndarray:
    """H_0 + sum_m nu_m H_m from the round's full-data Hessians ``curvature`` (function index
    -> H), ``first`` the index of the first constraint (1 when the objective is stochastic)."""
    weights = np.concatenate(([1.0] * first, np.asarray(nu, dtype=float)))
    total = np.zeros((d, d))
    for m, H in curvature.items():
        if weights[m] != 0.0:
            total += weights[m] * H
    return total


def take_curvature(arrays: dict, weight: float, total: dict, d: int) -> dict:
    """The reply's arrays without its curvature ones, whose matrices (times ``weight``, the
    reply's aggregation weight) are added into ``total`` (function index -> H)."""
    kept = {}
    for key, value in arrays.items():
        if key.startswith(CURVATURE):
            m = int(key[len(CURVATURE):])
            H = weight * unpack_symmetric(np.asarray(value, dtype=float), d)
            total[m] = H if m not in total else total[m] + H
        else:
            kept[key] = value
    return kept
