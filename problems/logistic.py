"""Logistic losses as SampleFunctions, optionally restricted to one class.

f(w, x, y) = weight(y) * log(1 + exp(-s (x.w))),  s = 2y - 1 in {-1, +1}, labels y in {0, 1}.

With ``only_label=k`` the weight is 1{y = k} / pi_k, where pi_k is the fraction of rows of class k
in the whole data, so that the average over all N rows equals the mean loss over class k: the
form the Neyman-Pearson problem needs (objective on one class, constraint on the other).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from scipy.special import expit

import ssca_solver as ss


def _margins(w, X, y):
    s = 2.0 * np.asarray(y, dtype=float) - 1.0
    return s, s * (X @ w)


def logistic_loss(only_label: Optional[int] = None, class_fraction: float = 1.0,
                  name: Optional[str] = None, curvature: bool = False) -> ss.SampleFunction:
    """The logistic loss (mean over all rows, or over one class) as a SampleFunction.

    Args:
      only_label: restrict to rows of this class (weights 1{y = k} / class_fraction).
      class_fraction: pi_k, the fraction of all N rows that are of class ``only_label``.
      curvature: attach a :class:`ssca_solver.DiagonalCurvature` surrogate that uses the exact
        diagonal of the loss Hessian.
    """
    if only_label is not None and not 0 < class_fraction <= 1:
        raise ValueError(f"class_fraction must be in (0, 1], got {class_fraction}")

    def weights(y):
        if only_label is None:
            return np.ones(len(y))
        return (np.asarray(y) == only_label) / class_fraction

    def value(w, X, y):
        _, m = _margins(w, X, y)
        return weights(y) * np.logaddexp(0.0, -m)

    def grad(w, X, y):
        s, m = _margins(w, X, y)
        coef = weights(y) * (-s) * expit(-m)
        return X.T @ coef / X.shape[0]

    def value_and_grad(w, X, y):
        # one product X @ w and one X' c per call where value and grad take two of each
        s, m = _margins(w, X, y)
        wt = weights(y)
        return wt * np.logaddexp(0.0, -m), X.T @ (wt * (-s) * expit(-m)) / X.shape[0]

    def per_sample_grad(w, X, y):
        # row n's gradient: weight(y_n) (-s_n) sigmoid(-m_n) x_n
        s, m = _margins(w, X, y)
        return X * (weights(y) * (-s) * expit(-m))[:, None]

    def hess_diag(w, X, y):
        _, m = _margins(w, X, y)
        p = expit(m)
        return (X * X).T @ (weights(y) * p * (1 - p)) / X.shape[0]

    def hess(w, X, y):
        # the logistic loss's Hessian is its Gauss-Newton form X' diag(p (1 - p)) X / n
        _, m = _margins(w, X, y)
        p = expit(m)
        return (X * (weights(y) * p * (1 - p))[:, None]).T @ X / X.shape[0]

    def hessp(w, X, y, V):
        # the same Hessian times V's columns without forming it: X' (s * (X V)) / n
        _, m = _margins(w, X, y)
        p = expit(m)
        return X.T @ ((weights(y) * p * (1 - p))[:, None] * (X @ V)) / X.shape[0]

    label = name or ("logistic" if only_label is None else f"logistic[y={only_label}]")
    sur = ss.DiagonalCurvature(hess_diag) if curvature else None
    fn = ss.SampleFunction(value, grad, name=label, surrogate=sur,
                           value_and_grad=value_and_grad, hess=hess, hessp=hessp,
                           convexity="convex", per_sample_grad=per_sample_grad)
    fn.hess_diag = hess_diag
    return fn
