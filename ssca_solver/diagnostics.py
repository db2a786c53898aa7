"""Full-data evaluations and KKT diagnostics of Problem 3 (Theorem 2's KKT point).

The evaluation is itself a federated exchange: each client returns sums of f_m and of grad f_m
over all its rows; the server divides by N. The server never reads rows.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
from scipy.optimize import nnls

from .federated import Request, array
from .functions import checked_value_and_grad, checked_values
from .result import KKTReport

#: The task name of full-data evaluations (registered with every algorithm's tasks).
EVALUATE = "evaluate"


class Evaluation(NamedTuple):
    """F_m(w) (values, one per stochastic function) and their gradients, on all N rows."""

    values: np.ndarray
    grads: Optional[np.ndarray]
    floats_up: int
    floats_down: int


class EvaluateTask:
    """Client side of a full-data evaluation: sums over all N_i rows of f_m(w, x_n) for every
    stochastic function m (``values``) and, with ``config["with_grad"]``, of their gradients
    (``grads``, shape (number of functions, d))."""

    def __init__(self, functions):
        self.functions = tuple(functions)

    def __call__(self, client, request):
        X, y, n, w = client.X, client.y, client.num_rows, request.w
        where = f"client {client.index}, full-data evaluation"
        if not request.config.get("with_grad"):
            vals = np.array([checked_values(f, w, X, y, n, where).sum() for f in self.functions])
            return client.reply(request, {"values": vals})
        both = [checked_value_and_grad(f, w, X, y, where) for f in self.functions]
        vals = np.array([v.sum() for v, _ in both])
        grads = np.array([n * g for _, g in both]).reshape(len(self.functions), w.size)
        return client.reply(request, {"values": vals, "grads": grads})


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


class Evaluator:
    """Full-data evaluations through the federated layer (the server never reads rows).

    ``tasks`` is what the clients must be able to run; :meth:`evaluate` asks every client for
    sums at w and divides by N (eq. (Fs0) and the F_m of Problem 3).
    """

    def __init__(self, problem):
        self.terms = ProblemTerms(problem.objective is not None, problem.bounds,
                                  problem.deterministic)
        self.num_samples = problem.data.num_samples
        self.tasks = {EVALUATE: EvaluateTask(problem.functions)}

    def evaluate(self, transport, w: np.ndarray, with_grad: bool) -> Evaluation:
        request = Request(EVALUATE, 0, np.asarray(w, dtype=float), {"with_grad": bool(with_grad)})
        up = count = 0
        values = grads = None
        for m in transport.stream(request):      # summed as they come: O(1) replies held
            v = array(m, "values")
            values = v.copy() if values is None else values + v
            if with_grad:
                g = array(m, "grads")
                grads = g.copy() if grads is None else grads + g
            up += m.num_floats()
            count += 1
        N = self.num_samples
        return Evaluation(values / N, grads / N if with_grad else None, up,
                          count * request.num_floats())

    def split(self, values: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray]:
        """(full objective F_0(w) + deterministic terms, F_m(w) - U_m)."""
        f0, cons = split_values(values, self.terms)
        return f0 + self.terms.deterministic.value(w), cons


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
