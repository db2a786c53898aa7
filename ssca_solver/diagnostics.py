"""Full-data evaluations and KKT diagnostics of Problem 3 (Theorem 2's KKT point).

The evaluation is itself a federated exchange: each client returns sums of f_m and of grad f_m
over all its rows; the server divides by N. The server never reads rows.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
from scipy.optimize import nnls

from .federated import EvaluationRequest
from .result import KKTReport


class Evaluation(NamedTuple):
    """F_m(w) (values, one per stochastic function) and their gradients, on all N rows."""

    values: np.ndarray
    grads: Optional[np.ndarray]
    floats_up: int
    floats_down: int


def evaluate(transport, w: np.ndarray, num_samples: int, with_grad: bool) -> Evaluation:
    """Ask every client for full-data sums at ``w`` and average them (eq. (Fs0) and F_m)."""
    msgs = transport.exchange(EvaluationRequest(np.asarray(w, dtype=float), with_grad))
    values = sum(m.values for m in msgs) / num_samples
    grads = sum(m.grads for m in msgs) / num_samples if with_grad else None
    return Evaluation(values, grads, sum(m.num_floats() for m in msgs), len(msgs) * w.size)


class ProblemTerms(NamedTuple):
    """What the diagnostics need to know about the problem's structure."""

    stochastic_objective: bool
    bounds: np.ndarray          # U_m
    deterministic: object       # DeterministicPart


def split_values(values: np.ndarray, terms: ProblemTerms) -> tuple[float, np.ndarray]:
    """(F_0 stochastic part or 0, F_m - U_m) from the per-function values."""
    k = 1 if terms.stochastic_objective else 0
    f0 = float(values[0]) if k else 0.0
    return f0, np.asarray(values[k:], dtype=float) - terms.bounds


def kkt_report(w: np.ndarray, ev: Evaluation, terms: ProblemTerms,
               dual_multipliers: np.ndarray, solver: str = "CLARABEL") -> KKTReport:
    """KKT residuals of Problem 3 at ``w`` on the full data.

    Multipliers: with no domain and only quadratic deterministic terms, mu solves the
    nonnegative least-squares fit
        min_{mu >= 0} |g_0 + G mu|^2 + sum_m (mu_m g_m)^2,   g_m = F_m(w) - U_m,
    of stationarity and complementarity together (so an inactive constraint gets mu ~ 0);
    otherwise the duals of the last subproblem are used. Stationarity is then the gradient norm
    of the Lagrangian, or the prox-gradient residual when a domain or a non-quadratic
    deterministic term is present.
    """
    det = terms.deterministic
    k = 1 if terms.stochastic_objective else 0
    _, cons = split_values(ev.values, terms)
    M = cons.size
    g0 = ev.grads[0] if k else np.zeros(w.size)
    G = ev.grads[k:].T if M else np.zeros((w.size, 0))
    gradient_form = not det.has_domain and det.smooth
    if gradient_form:
        g0 = g0 + det.grad(w)
        if M:
            A = np.vstack([G, np.diag(cons)])
            b = np.concatenate([-g0, np.zeros(M)])
            mu, _ = nnls(A, b)
        else:
            mu = np.zeros(0)
        stat = float(np.linalg.norm(g0 + G @ mu))
        kind, source = "gradient", "nnls"
    else:
        mu = np.asarray(dual_multipliers, dtype=float).copy()
        stat = det.prox_residual(w, g0 + G @ mu, solver=solver)
        kind, source = "prox-gradient", "subproblem"
    return KKTReport(multipliers=mu, multiplier_source=source, stationarity=stat,
                     stationarity_kind=kind, feasibility=np.maximum(cons, 0.0),
                     complementarity=np.abs(mu * cons),
                     domain_violation=det.domain_violation(w))
